"""What a run leaves behind, said once on rank 0 at its end (R-UX-2).

`print_run_summary` reads the run directory itself (metrics.jsonl is the record, run.json
the identity), so the normal end and every error path (refusal, failure, signal) describe
a run the same way: the figures, what exists on disk and the command to continue.
Imports no torch.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

from embodichain.core.checkpoint.manifest import checkpoint_step
from embodichain.core.checkpoint.names import BEST, LAST, snapshot_names
from embodichain.core.recipe.best import DEFAULT_BEST, Best
from embodichain.core.runs.best_record import run_best, stopped_early_event, stopped_early_text
from embodichain.core.runs.commands import command_for
from embodichain.core.runs.run_dir import METRICS, planned_updates, read_metrics, read_run_json
from embodichain.core.runs.snapshots import newest_snapshot_path

Status = Literal["finished", "stopped", "failed", "refused"]


@dataclass
class Figure:
    """One metric over a run: its last value and, for the best metric, its best."""

    key: str
    final: float
    final_step: int
    best: float | None = None
    best_step: int | None = None


@dataclass
class RunFacts:
    """What a run directory holds, read back from its files."""

    directory: Path
    run_id: str | None = None
    world_size: int | None = None
    max_updates: int | None = None
    last_step: int | None = None  # newest step in metrics.jsonl
    figures: list[Figure] = field(default_factory=list)
    snapshots: list[str] = field(default_factory=list)  # step files by step, then last/best
    best: Best = DEFAULT_BEST
    stopped_early: dict[str, Any] | None = None  # run.json's stopped_early event, if last
    memory_peaks: dict[int, float] = field(default_factory=dict)  # rank -> bytes (R-OPS-3)


def metric_figures(records: list[Mapping[str, Any]], best: Best = DEFAULT_BEST
                   ) -> list[Figure]:
    """`train/loss` and every `validation/*` and `validation_ema/*` key (`ema.validate:
    both`): the final value and, for the run's best metric (R-MET-1), the best in its
    direction (ties keep the earliest update). Nothing says which way the other keys are
    better, so they get no "best"."""
    figures: dict[str, Figure] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, int):
            continue
        for key, value in record.items():
            if not (key == "train/loss" or key.startswith(("validation/", "validation_ema/"))):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            value = float(value)
            fig = figures.get(key)
            if fig is None:
                fig = figures[key] = Figure(key, value, step)
            fig.final, fig.final_step = value, step
            if key == best.metric and best.improves(value, fig.best):
                fig.best, fig.best_step = value, step
    return sorted(figures.values(), key=lambda f: (f.key != "train/loss", f.key))


def memory_peaks(records: list[Mapping[str, Any]]) -> dict[int, float]:
    """Each rank's largest logged `memory/peak_rank_R` (bytes) over the run."""
    peaks: dict[int, float] = {}
    for record in records:
        for key, value in record.items():
            rank = key.removeprefix("memory/peak_rank_")
            if rank != key and rank.isdigit() and isinstance(value, int | float) \
                    and not isinstance(value, bool):
                peaks[int(rank)] = max(peaks.get(int(rank), 0.0), float(value))
    return peaks


def read_run_facts(directory: Path) -> RunFacts:
    """Everything the summary says about `directory`; never fails on damaged files."""
    facts = RunFacts(Path(directory))
    try:
        identity = read_run_json(directory) or {}
    except Exception:  # an unreadable run.json must not hide what else exists
        identity = {}
    facts.run_id = identity.get("run_id")
    facts.world_size = identity.get("world_size")
    facts.max_updates = planned_updates(identity)  # raised by a resume's --set, if so
    facts.best = run_best(identity)
    facts.stopped_early = stopped_early_event(identity)
    log = read_metrics(directory / METRICS)
    facts.last_step = log.last_step
    facts.figures = metric_figures(log.records, facts.best)
    facts.memory_peaks = memory_peaks(log.records)
    facts.snapshots = snapshot_names(directory) if directory.is_dir() else []
    return facts


def summary_lines(directory: Path, *, status: Status = "finished", start_step: int | None = None,
                  end_step: int | None = None, wall_s: float | None = None,
                  reason: str | None = None) -> list[str]:
    """The summary as plain lines (see `print_run_summary`)."""
    facts = read_run_facts(Path(directory))
    d = shlex.quote(str(directory))
    end = end_step if end_step is not None else facts.last_step
    run = f"run {facts.run_id[:12]}" if facts.run_id else f"run in {directory}"
    of = f"/{facts.max_updates}" if facts.max_updates else ""
    head = {"finished": f"{run} finished at update {end}{of}",
            "stopped": f"{run} stopped at update {end}{of}",
            "failed": f"{run} failed" + (f" at update {end}{of}" if end is not None else ""),
            "refused": f"{run}: nothing was started"}[status]
    if status == "finished" and facts.stopped_early is not None:
        head = f"{run} {stopped_early_text(facts.stopped_early)}"
    lines = [head + (f": {reason}" if reason else "")]
    w = max([11] + [len(fig.key) for fig in facts.figures])

    def row(label: str, text: str) -> None:
        lines.append(f"  {label:<{w}} {text}")

    if start_step is not None and end is not None:
        done = end - start_step
        text = f"{done} in this process ({start_step} -> {end}), {end} in total"
        if wall_s is not None and wall_s > 0:
            text += f"; {wall_s:.1f} s wall, {done / wall_s:.1f} updates/s"
        row("updates", text)
    for fig in facts.figures:
        text = f"final {fig.final:.6g} (update {fig.final_step})"
        if fig.best is not None:
            text += f", best {fig.best:.6g} (update {fig.best_step})"
        row(fig.key, text)
    if facts.memory_peaks:
        row("memory", "peak " + ", ".join(f"rank {r} {v / 2**30:.2f} GiB"
                                          for r, v in sorted(facts.memory_peaks.items())))
    row("run dir", str(directory))
    shown = [f"{name} (update {step})" if name in (LAST, BEST)
             and (step := checkpoint_step(Path(directory) / name)) is not None else name
             for name in facts.snapshots]
    row("snapshots", ", ".join(shown) or "none")
    newest = newest_snapshot_path(Path(directory)) if facts.snapshots else None
    if newest is not None:
        row("inspect", f"embodichain inspect-checkpoint {d}/{newest.name}")
    if status == "finished" and facts.stopped_early is not None:
        patience = facts.stopped_early.get("patience")
        more = 2 * patience if isinstance(patience, int) else "N"
        row("train on", command_for(f"resume {d} --set trainer.early_stop.patience={more}",
                                    facts.world_size))
    elif status == "finished":
        more = 2 * (end or facts.max_updates or 0) or "N"
        row("train on", command_for(f"resume {d} --set trainer.max_updates={more}",
                                    facts.world_size))
    elif status != "refused":
        saved = any(name != BEST for name in facts.snapshots)
        row("continue", command_for(f"resume {d}", facts.world_size)
            + ("" if saved else "  (no snapshot yet: it restarts at update 0)"))
    if facts.figures:  # a report drawn before is replaced only when asked (report --force)
        again = " --force" if (Path(directory) / "report.png").exists() else ""
        row("curves", f"embodichain report {d}{again}")
    return lines


def print_run_summary(directory: Path, *, status: Status = "finished",
                      start_step: int | None = None, end_step: int | None = None,
                      wall_s: float | None = None, reason: str | None = None,
                      file: TextIO | None = None) -> None:
    """Print what the run in `directory` did and holds, and how to continue (rank 0 only).

    `start_step`/`end_step`/`wall_s` describe this process's part; `status` says how it
    ended; `reason` adds one phrase to the first line (e.g. "SIGTERM" or the error).
    """
    out = file or sys.stdout
    for line in summary_lines(directory, status=status, start_step=start_step,
                              end_step=end_step, wall_s=wall_s, reason=reason):
        print(line, file=out)
    out.flush()
