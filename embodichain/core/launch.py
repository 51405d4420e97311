"""Run a recipe on every worker: fresh, from a checkpoint, in place, or auto.

Rank 0 alone inspects, locks and claims the output directory and reads the checkpoint
(resume_policy decides how the run starts); it then sends every rank the outcome, so a
refusal is decided (and printed) once and all ranks exit with the same code (R-DIST-5,
SPEC §9). SIGINT / SIGTERM stop every rank at the same update with a snapshot (R-SIG-1).
"""

from __future__ import annotations

import contextlib
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

import embodichain
from embodichain.core import distributed as dist_utils
from embodichain.core.config import config_sha256
from embodichain.core.errors import RefusedError, Stopped, TrainingError, UsageError
from embodichain.core.loggers import LoggingMetricsWriter, check_loggers
from embodichain.core.progress import configure_logging, log
from embodichain.core.recipe import Recipe
from embodichain.core.resume_policy import (
    RunComplete,
    Start,
    config_differences,
    prepare,
    resume_problems,
)
from embodichain.core.run_dir import new_run_id, now_iso
from embodichain.core.run_lock import RunLock
from embodichain.core.signals import StopRequest
from embodichain.core.source import stream_seed
from embodichain.core.summary import Status, print_run_summary
from embodichain.core.trainer import RunContext, SupervisedTrainer


def train(recipe: Recipe, *, start: Start | None = None, show_progress: bool = True
          ) -> dict[str, float]:
    """Build the recipe's trainer on every rank, prepare the run directory and fit.

    `start` says how the run begins (fresh by default; see resume_policy.Start).
    """
    start = start or Start()
    config = recipe.config
    configure_logging(dist_utils.env_rank())
    check_loggers(config.trainer.loggers)  # a missing extra is refused before anything starts
    lock = RunLock(Path(config.trainer.output_dir))
    # Installed before the group exists: a signal during set-up stops at the first update.
    with StopRequest() as stop, dist_utils.distributed_run(config.device) as device:
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
                outcome = _prepare_on_rank_zero(recipe, trainer, start, lock)
            outcome = dist_utils.broadcast_from_rank_zero(outcome)
            if "refused" in outcome:
                dist_utils.wait_for_rank_zero_exit(outcome)
                raise RefusedError(outcome["refused"])
            if "failed" in outcome:
                dist_utils.wait_for_rank_zero_exit(outcome)
                raise TrainingError(f"preparing the run failed on rank 0: {outcome['failed']}")
            if "complete" in outcome:
                if dist_utils.is_rank_zero():
                    log.info("%s", outcome["complete"])
                return {}
            if outcome["payload"] is not None:
                trainer.restore(outcome["payload"])
            directory = Path(config.trainer.output_dir)
            metrics = None
            if dist_utils.is_rank_zero():
                continued = trainer.step if start.kind != "fresh" else None
                metrics = LoggingMetricsWriter(directory, config.trainer.loggers, continued)
            trainer.attach(RunContext(directory, outcome["identity"], metrics))
            if dist_utils.is_rank_zero():
                for note in outcome["notes"]:
                    log.info("%s", note)
                log.info("run %s: %s in %s (world size %d, device %s)",
                         outcome["identity"]["run_id"][:12],
                         f"resuming at update {trainer.step}" if start.kind != "fresh"
                         else "training", directory, dist_utils.world_size(), device)
            start_step, started = trainer.step, time.perf_counter()
            status: Status = "failed"
            try:
                final = trainer.fit(show_progress=show_progress, stop=stop)
                status = "finished"
                return final
            except (Stopped, KeyboardInterrupt):
                status = "stopped"
                raise
            finally:
                # Whatever the end, rank 0 says what exists and how to continue (R-UX-2);
                # the error itself is printed after this by the CLI. A closed stdout must
                # not turn a finished run into a failure.
                if dist_utils.is_rank_zero():
                    with contextlib.suppress(OSError):
                        print_run_summary(directory, status=status, start_step=start_step,
                                          end_step=trainer.step,
                                          wall_s=time.perf_counter() - started)
        finally:
            trainer.close()
            lock.release()


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass


def _prepare_on_rank_zero(recipe: Recipe, trainer: SupervisedTrainer, start: Start,
                          lock: RunLock) -> dict[str, Any]:
    identity = {
        "run_id": new_run_id(),
        "created_at": now_iso(),
        "factory": recipe.config.factory,
        "config_sha256": config_sha256(recipe.resolved),
        "source_identity": trainer.source.identity,
        "world_size": dist_utils.world_size(),
        "versions": versions(recipe),
        "config": recipe.resolved,
        "resumed_from": None,
    }
    directory = Path(recipe.config.trainer.output_dir)
    try:
        prepared = prepare(start, identity, directory, lock, recipe.source)
        lock.publish(identity["created_at"])
    except RunComplete as done:
        return {"complete": str(done)}
    except UsageError as exc:
        return {"refused": str(exc), **dist_utils.rank_zero_origin()}
    except Exception as exc:  # the other ranks wait for an outcome: they must hear of it
        return {"failed": f"{type(exc).__name__}: {exc}", **dist_utils.rank_zero_origin()}
    return {"identity": prepared.identity, "payload": prepared.payload,
            "notes": list(prepared.notes)}


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


__all__ = ["train", "resume_problems", "config_differences"]
