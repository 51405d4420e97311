"""`embodichain reproduce`: train a run's stored recipe again and say whether the history is
the same, bitwise (R-TRUST-5).

The launching command checks the input (`prepare`), trains on the run's world size (in
this process, or in the workers it self-launches, each running `train_reproduction`) and
then compares (`compare`): metrics.jsonl record by record, the snapshots tensor by tensor,
and the environments both runs recorded.

`--until N` trains the first N updates of the same run: the recipe keeps its
`trainer.max_updates` (a schedule spanning it, or a sampler's order, would otherwise
change every update), and the trainer stops after update N. The new directory is then a run
stopped at N that `resume` continues to the end.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodichain.core.runs import reproduce as record
from embodichain.core.runs.commands import SELF_LAUNCHED
from embodichain.core.runs.reproduce import Plan
from embodichain.core.runs.run_dir import read_run_json


def is_worker() -> bool:
    """Whether this process is one of the workers a reproduction launched."""
    return bool(os.environ.get(SELF_LAUNCHED)) and "LOCAL_RANK" in os.environ


def under_foreign_launcher() -> bool:
    """Whether torchrun (not the reproduction itself) started this process."""
    return "LOCAL_RANK" in os.environ and not os.environ.get(SELF_LAUNCHED)


def prepare(run_dir: Path, output: Path | None, until: int | None) -> Plan:
    """The reproduction's plan, its recipe checked as the workers will load it (exit 2 on
    anything wrong, before any worker starts or anything is written)."""
    from embodichain.core.errors import UsageError

    if under_foreign_launcher():
        raise UsageError("reproduce starts the run's workers itself (as many as the run "
                         "had); run it as `embodichain reproduce RUN_DIR`, not under torchrun")
    from embodichain.core.runs.run_lock import refuse_if_locked

    refuse_if_locked(run_dir)  # a live run's record is still growing: nothing to check yet
    plan = record.plan(run_dir, output, until)
    _load(plan, plan.world_size)
    return plan


def _load(plan: Plan, local_ranks: int):  # noqa: ANN202 - a Recipe; loading is torch-free
    from embodichain.core.launch import api

    return api.load_recipe(plan.config, source=plan.source, warn=False,
                           local_ranks=local_ranks)


def train_reproduction(run_dir: Path, output: Path, through: int,
                       show_progress: bool = True) -> None:
    """On every rank: the stored recipe of `run_dir`, from scratch, into `output`, stopping
    after update `through` (the recipe's own `trainer.max_updates` kept)."""
    from embodichain.core.distributed import determinism, process_group
    from embodichain.core.distributed.stop_request import StopRequest
    from embodichain.core.launch.train import build_trainer
    from embodichain.core.observe.progress import configure_logging

    plan = record.plan(run_dir, output, through, check_output=False)
    recipe = _load(plan, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    configure_logging(process_group.env_rank())
    with determinism.applied(recipe.config.trainer.deterministic), StopRequest() as stop, \
            process_group.distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device)
        # After the build, the schedule and the data order were made for the whole run:
        # only the loop stops at `through`. The run records the recipe as it is (a copy,
        # which `resume` continues to its end).
        opener = trainer.run_opener
        assert opener is not None
        trainer.run_opener = dataclasses.replace(opener, recipe=dataclasses.replace(
            recipe, config=recipe.config.model_copy(deep=True)))
        trainer.config.trainer.max_updates = min(through,
                                                 trainer.config.trainer.max_updates)
        trainer.fit(show_progress=show_progress, stop=stop)


@dataclass(frozen=True)
class Verdict:
    """What `reproduce` prints, and its exit code (0 identical, 1 different)."""

    exit_code: int
    lines: list[str]


def compare(plan: Plan) -> Verdict:
    """The reproduction in `plan.output` against the original, through `plan.through`."""
    from embodichain.core.runs.snapshot_compare import compare_snapshots

    original = read_run_json(plan.run_dir) or {}
    reproduction = read_run_json(plan.output) or {}
    metrics = record.compare_metrics(plan.run_dir, plan.output, plan.through)
    snapshots = compare_snapshots(plan.run_dir, plan.output, plan.through,
                                  set(original) | set(reproduction))
    environment = record.environment_differences(original, reproduction)
    lines = [f"reproduced {plan.run_dir} in {plan.output} ({plan.world_size} "
             f"worker{'s' if plan.world_size > 1 else ''}, updates 1-{plan.through})"]
    differences = sorted((d for d in (metrics.difference, snapshots.difference)
                          if d is not None), key=lambda d: d.update)
    if not differences and not metrics.records and not snapshots.names:
        # e.g. the original's only snapshot came from a time-based save (save_every_s)
        differences = [record.Difference(plan.through, "nothing",
                                         "the two runs recorded nothing at the same update")]
    if differences:
        lines.append(f"differs: {differences[0].sentence()}")
        lines += [f"  also: {d.sentence()}" for d in differences[1:]]
    else:  # through the last update the original recorded something at (plan: one at least)
        through = max(metrics.last_step, snapshots.last_step)
        saved = (f"the snapshots {', '.join(snapshots.names)} ({snapshots.tensors} tensors "
                 "in all, and every other value of their state)" if snapshots.names
                 else "no snapshot (none saved at the same update by both)")
        lines.append(f"bitwise identical through update {through}: {metrics.records} "
                     f"metrics records (all but time/*) and {saved}")
    if environment:
        lines.append("the recorded environments differ:")
        lines += [f"  {line}" for line in environment]
    else:
        lines.append("the recorded environments are the same: "
                     + record.environment_summary(reproduction))
    lines += [f"note: {note}" for note in plan.notes]
    verdict = Verdict(1 if differences else 0, lines)
    _record(plan, original, verdict)
    return verdict


def _record(plan: Plan, original: Mapping[str, Any], verdict: Verdict) -> None:
    """The reproduction's run.json says which run it reproduced, through which update, and
    the verdict (its first line)."""
    from embodichain.core.runs.run_dir import now_iso, update_run_json

    event = {"event": "reproduced", "at": now_iso(), "of": str(plan.run_dir),
             "run_id": original.get("run_id"), "through": plan.through,
             "identical": verdict.exit_code == 0, "verdict": verdict.lines[1]}
    update_run_json(plan.output, lambda data: data.setdefault("events", []).append(event))
