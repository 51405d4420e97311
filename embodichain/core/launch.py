"""Run a recipe on every worker: fresh, resumed into a fresh directory, or resumed in place.

Rank 0 alone inspects and claims the output directory and reads the checkpoint; it then
sends every rank the outcome, so a refusal is decided (and printed) once and all ranks
exit with the same code (R-DIST-5, R-RESUME-2..5, SPEC §9).
"""

from __future__ import annotations

import platform
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import embodichain
from embodichain.core import distributed as dist_utils
from embodichain.core.checkpoint import (
    check_rank_entries,
    read_checkpoint,
    step_filename,
    step_files,
)
from embodichain.core.config import RESUMABLE_CHANGES, config_sha256, flatten_keys
from embodichain.core.errors import RefusedError, TrainingError, UsageError
from embodichain.core.progress import configure_logging, log
from embodichain.core.recipe import Recipe
from embodichain.core.run_dir import (
    METRICS,
    RUN_JSON,
    MetricsWriter,
    claim,
    move_torn_tail,
    new_run_id,
    now_iso,
    read_metrics,
    read_run_json,
    update_run_json,
)
from embodichain.core.source import stream_seed
from embodichain.core.trainer import RunContext, SupervisedTrainer


def train(recipe: Recipe, *, resume: Path | None = None,
          checkpoint: Mapping[str, Any] | None = None, show_progress: bool = True
          ) -> dict[str, float]:
    """Build the recipe's trainer on every rank, prepare the run directory and fit.

    `resume` names a checkpoint; `checkpoint` may carry it already loaded and verified.
    """
    config = recipe.config
    configure_logging(dist_utils.env_rank())
    with dist_utils.distributed_run(config.device) as device:
        _seed_everything(config.seed)
        trainer = recipe.factory(config, device)
        if not isinstance(trainer, SupervisedTrainer):
            raise UsageError(f"factory {config.factory} returned {type(trainer).__name__}, "
                             "not a SupervisedTrainer")
        try:
            # Ranks share the model init above; from here on each has its own streams.
            _seed_everything(stream_seed(config.seed, dist_utils.rank()) % (2**32))
            outcome = None
            if dist_utils.is_rank_zero():
                outcome = _prepare_on_rank_zero(recipe, trainer, resume, checkpoint)
            outcome = dist_utils.broadcast_from_rank_zero(outcome)
            if "refused" in outcome:
                dist_utils.wait_for_rank_zero_exit(outcome)
                raise RefusedError(outcome["refused"])
            if "failed" in outcome:
                dist_utils.wait_for_rank_zero_exit(outcome)
                raise TrainingError(f"preparing the run failed on rank 0: {outcome['failed']}")
            if outcome["payload"] is not None:
                trainer.restore(outcome["payload"])
            directory = Path(config.trainer.output_dir)
            metrics = MetricsWriter(directory / METRICS) if dist_utils.is_rank_zero() else None
            trainer.attach(RunContext(directory, outcome["identity"], metrics))
            if dist_utils.is_rank_zero():
                log.info("run %s: %s in %s (world size %d, device %s)",
                         outcome["identity"]["run_id"][:12],
                         f"resuming at update {trainer.step}" if resume else "training",
                         directory, dist_utils.world_size(), device)
            return trainer.fit(show_progress=show_progress)
        finally:
            trainer.close()


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass


def _prepare_on_rank_zero(recipe: Recipe, trainer: SupervisedTrainer, resume: Path | None,
                          checkpoint: Mapping[str, Any] | None) -> dict[str, Any]:
    try:
        return _prepare(recipe, trainer, resume, checkpoint)
    except UsageError as exc:
        return {"refused": str(exc), **dist_utils.rank_zero_origin()}
    except Exception as exc:  # the other ranks wait for an outcome: they must hear of it
        return {"failed": f"{type(exc).__name__}: {exc}", **dist_utils.rank_zero_origin()}


def _prepare(recipe: Recipe, trainer: SupervisedTrainer, resume: Path | None,
             checkpoint: Mapping[str, Any] | None) -> dict[str, Any]:
    resolved = recipe.resolved
    directory = Path(recipe.config.trainer.output_dir)
    identity = {
        "run_id": new_run_id(),
        "created_at": now_iso(),
        "factory": recipe.config.factory,
        "config_sha256": config_sha256(resolved),
        "source_identity": trainer.source.identity,
        "world_size": dist_utils.world_size(),
        "versions": versions(recipe),
        "config": resolved,
        "resumed_from": None,
    }
    if resume is None:
        claim(directory, {**identity, "events": []})
        return {"identity": identity, "payload": None}

    data = checkpoint if checkpoint is not None else read_checkpoint(resume)
    check_rank_entries(data, resume)
    payload = data["payload"]
    snapshot = payload["run"]
    problems = resume_problems(snapshot, resolved, identity)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise RefusedError(f"cannot resume from {resume}: it differs from this run in\n{listed}"
                           "\nNothing was changed.")
    if directory.is_dir() and directory.resolve() == resume.parent.resolve():
        identity = _continue_in_place(directory, resume, snapshot, identity, recipe.source)
    else:
        identity["resumed_from"] = {"run_id": snapshot.get("run_id"), "checkpoint": str(resume),
                                    "step": snapshot["step"]}
        claim(directory, {**identity, "events": []})
    return {"identity": identity, "payload": payload}


def resume_problems(snapshot: Mapping[str, Any], resolved: Mapping[str, Any],
                    identity: Mapping[str, Any]) -> list[str]:
    """Each field that forbids resuming `snapshot` as this run, with both values."""
    problems = []
    if snapshot["world_size"] != identity["world_size"]:
        problems.append(f"world_size: checkpoint {snapshot['world_size']}, "
                        f"this run {identity['world_size']} (exact recovery needs the same "
                        "number of workers)")
    if snapshot.get("source_identity") != identity["source_identity"]:
        problems.append(f"source identity: checkpoint {snapshot.get('source_identity')}, "
                        f"this run {identity['source_identity']}")
    problems += config_differences(snapshot["config"], resolved, int(snapshot["step"]))
    return problems


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], step: int
                       ) -> list[str]:
    """Recipe differences that forbid resuming (R-RESUME-2); some keys may change."""
    old, new = flatten_keys(saved), flatten_keys(current)
    problems = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if a == b or key in RESUMABLE_CHANGES:
            continue
        problems.append(f"{key}: checkpoint {a!r}, this run {b!r}")
    max_updates = new.get("trainer.max_updates")
    if isinstance(max_updates, int) and max_updates < step:
        problems.append(f"trainer.max_updates: {max_updates} is below the checkpoint's "
                        f"update {step}")
    return problems


def _continue_in_place(directory: Path, checkpoint: Path, snapshot: Mapping[str, Any],
                       identity: dict[str, Any], recipe_source: str | None = None
                       ) -> dict[str, Any]:
    """Checks of R-RESUME-4; then records the resume in run.json and keeps the run's id."""
    step = int(snapshot["step"])
    config_path = (recipe_source if recipe_source and Path(recipe_source).is_file()
                   else "RECIPE.yaml")
    fresh_cmd = (f"resume into a fresh directory instead: embodichain train-sl --config "
                 f"{config_path} --resume {checkpoint} "
                 f"--set trainer.output_dir={directory}_resumed")
    run_json = read_run_json(directory)
    if snapshot.get("run_id") is None:
        raise RefusedError(f"{checkpoint} carries no run identity, so it cannot continue "
                           f"{directory} in place; {fresh_cmd}")
    if run_json is None or run_json.get("run_id") != snapshot["run_id"]:
        found = run_json.get("run_id") if run_json else f"no {RUN_JSON}"
        raise RefusedError(f"{checkpoint} belongs to run {snapshot['run_id']}, but {directory} "
                           f"holds run {found}; {fresh_cmd}")
    history = read_metrics(directory / METRICS)
    if history.last_step is not None and history.last_step > step:
        raise RefusedError(
            f"{directory}/{METRICS} already has records up to update {history.last_step}, "
            f"beyond the checkpoint's update {step}; continuing in place would mix two "
            f"histories. {fresh_cmd}")
    later = [path.name for n, path in step_files(directory) if n > step]
    if later:
        raise RefusedError(
            f"{directory} already holds checkpoints beyond update {step} "
            f"({', '.join(later[:3])}{', ...' if len(later) > 3 else ''}); continuing in place "
            f"would replace them. {fresh_cmd}")
    torn = move_torn_tail(directory)
    event = {"event": "resumed", "at": now_iso(), "checkpoint": checkpoint.name, "step": step,
             "world_size": identity["world_size"], "config_sha256": identity["config_sha256"]}
    if torn is not None:
        event["torn_metrics_line_moved_to"] = "metrics.torn.jsonl"

    def record(data: dict[str, Any]) -> None:
        data.setdefault("events", []).append(event)

    update_run_json(directory, record)
    return {**identity, "run_id": run_json["run_id"], "created_at": run_json.get("created_at"),
            "resumed_from": run_json.get("resumed_from")}


def versions(recipe: Recipe) -> dict[str, str]:
    found = {"python": platform.python_version(), "torch": str(torch.__version__),
             "embodichain": embodichain.__version__}
    module = sys.modules.get(getattr(recipe.factory, "__module__", "") or "")
    top = (module.__name__.split(".")[0] if module else "")
    if top and top != "embodichain":
        try:
            import importlib_metadata
            dists = importlib_metadata.packages_distributions().get(top, [])
            for dist in dists:
                found[dist] = importlib_metadata.version(dist)
        except Exception:
            pass
    return found


__all__ = ["train", "resume_problems", "config_differences", "step_filename"]
