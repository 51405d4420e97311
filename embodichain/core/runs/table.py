"""The runs below a directory and their state, for `embodichain runs` (no torch).

"Running" comes only from the run's lock (R-RUN-5): a live run's rank 0 holds `flock` on
`RUN_DIR/.lock`, and the kernel drops it when the process dies. A run without a live lock
is finished when its newest record or snapshot reached `trainer.max_updates` of its stored
recipe, stopped early when run.json's last word is an early stop (R-MET-2), stopped (cleanly)
when it is a clean stop, and interrupted otherwise (run_end: killed, crashed); a run.json
from before clean stops were recorded leaves that last case unknown. Each run shows its own
best metric (R-MET-1), as run.json records it.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embodichain.core.errors import RefusedError
from embodichain.core.runs.best_record import run_best, stopped_early_event, stopped_early_text
from embodichain.core.runs.run_dir import (
    METRICS,
    RUN_JSON,
    planned_updates,
    read_metrics,
    read_run_json,
)
from embodichain.core.runs.run_end import clean_stop, failure, records_clean_stops
from embodichain.core.runs.run_lock import describe_holder, lock_holder
from embodichain.core.runs.snapshots import newest_snapshot


@dataclass
class RunRow:
    """One line of the runs table; `--json` prints these fields."""

    directory: str
    run_id: str | None
    factory: str | None
    world_size: int | None
    state: str  # running | finished | stopped_early | stopped | failed | interrupted | unknown
    last_step: int | None  # newest step recorded in metrics.jsonl or a snapshot
    last_record_step: int | None  # newest step recorded in metrics.jsonl
    max_updates: int | None
    snapshot_step: int | None
    metric: str  # the run's best metric (trainer.best), e.g. validation/accuracy
    metric_mode: str  # min | max
    metric_last: float | None  # its newest value
    metric_best: float | None  # its best value, in its direction
    metric_best_step: int | None
    stopped_early: dict[str, Any] | None  # run.json's stopped_early event
    stopped: dict[str, Any] | None  # run.json's clean-stop event (its last word)
    failed: dict[str, Any] | None  # run.json's failure event (its last word)
    modified: str  # newest file time in the directory, local ISO time
    holder: dict[str, Any] | None  # who holds the lock while running

    @property
    def state_text(self) -> str:
        if self.state == "running":
            return f"running ({describe_holder(self.holder or {})})"
        if self.state == "stopped" and self.stopped is not None:
            return (f"stopped cleanly at update {self.stopped.get('step')} "
                    f"({self.stopped.get('signal')})")
        seen = (f"last update seen {_step(self.last_record_step)}, newest snapshot "
                f"{_step(self.snapshot_step)}")
        if self.state == "failed" and self.failed is not None:
            return (f"failed at update {self.failed.get('step')}: {self.failed.get('error')} "
                    f"(newest snapshot {_step(self.snapshot_step)})")
        if self.state == "interrupted":
            return f"interrupted without a clean stop ({seen})"
        if self.state == "unknown":  # a clean stop and a kill look alike in this run.json
            return f"unknown: ended before clean stops were recorded ({seen})"
        if self.state == "stopped_early" and self.stopped_early is not None:
            return stopped_early_text(self.stopped_early)
        return self.state

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "state_text": self.state_text}


def _step(step: int | None) -> str:
    return "none" if step is None else str(step)


def find_runs(root: Path) -> list[Path]:
    """Every directory at or below `root` holding a run.json, by path."""
    if (root / RUN_JSON).is_file():
        return [root]
    return sorted(path.parent for path in root.rglob(RUN_JSON))


def describe_run(directory: Path) -> RunRow:
    """The table row of one run directory; never fails on damaged files."""
    try:
        identity = read_run_json(directory) or {}
    except Exception:
        identity = {}
    max_updates = planned_updates(identity)  # raised by a resume's --set, if so
    records = read_metrics(directory / METRICS).records
    steps = [r["step"] for r in records if isinstance(r.get("step"), int)]
    best = run_best(identity)
    series = [(r["step"], float(r[best.metric])) for r in records
              if isinstance(r.get("step"), int) and isinstance(r.get(best.metric), int | float)
              and not isinstance(r.get(best.metric), bool)]
    best_of = best.best_of(series)
    early = stopped_early_event(identity)
    try:  # the snapshot `resume` would continue from (manifests only, not verified)
        newest = newest_snapshot(directory, verify=False)
    except RefusedError:  # none reads
        newest = None
    snapshot = newest.step if newest is not None else None
    last = max(steps + ([snapshot] if snapshot is not None else []), default=None)
    holder = lock_holder(directory)
    if holder is not None:
        state = "running"
    elif isinstance(max_updates, int) and last is not None and last >= max_updates \
            and clean_stop(identity) is None:  # a stop at the end before its validation
        state = "finished"
    elif early is not None:
        state = "stopped_early"
    elif not records_clean_stops(identity):
        state = "unknown"
    elif clean_stop(identity) is not None:
        state = "stopped"
    elif failure(identity) is not None:
        state = "failed"
    else:
        state = "interrupted"
    mtimes = [p.stat().st_mtime for p in directory.iterdir() if p.is_file()]
    modified = datetime.datetime.fromtimestamp(max(mtimes, default=directory.stat().st_mtime))
    return RunRow(
        directory=str(directory), run_id=identity.get("run_id"),
        factory=identity.get("factory"), world_size=identity.get("world_size"), state=state,
        last_step=last, last_record_step=max(steps, default=None), max_updates=max_updates,
        snapshot_step=snapshot,
        metric=best.metric, metric_mode=best.mode,
        metric_last=series[-1][1] if series else None,
        metric_best=best_of[0] if best_of else None,
        metric_best_step=best_of[1] if best_of else None, stopped_early=early,
        stopped=clean_stop(identity) if state == "stopped" else None,
        failed=failure(identity) if state == "failed" else None,
        modified=modified.isoformat(sep=" ", timespec="seconds"), holder=holder)
