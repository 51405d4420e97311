"""A trainer's snapshots: what a checkpoint holds, when and how it is written, and how a
rank takes its part back (R-CKPT-1..9, R-VAL-2).

At a save every rank captures its own state (RNG streams, sampler position, buffers); the
strategy adds the learner's state and turns the snapshot into this rank's save job (DDP:
everything gathered to rank 0, which writes one file; FSDP: every rank its shard, rank 0
the manifest). One `CheckpointWriter` per rank runs the jobs, in the background unless
`trainer.async_save` is off, with at most one save in flight; a save that fails stops every
rank at the next boundary. A save asked for during validation (a callback's `save()` on
rank 0) is remembered and written by every rank together as validation ends: validation
changes no training state, so it is the state of the update validated, and no collective
runs inside the callback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from embodichain.core.checkpoint.names import LAST, step_files, step_of
from embodichain.core.checkpoint.rank_state import (
    capture_buffers,
    capture_rng,
    continued_stream_seed,
    restore_buffers,
    restore_rng,
    seed_streams,
)
from embodichain.core.checkpoint.writer import (
    CheckpointWriter,
    SaveClock,
    SaveFailure,
    rank_zero_note,
)
from embodichain.core.data.samplers import Sampler
from embodichain.core.distributed import process_group
from embodichain.core.recipe.best import BestTracker
from embodichain.core.recipe.schema import TrainerConfig
from embodichain.core.runs.run_dir import MetricsWriter
from embodichain.core.training.learner import Learner
from embodichain.core.training.model_facts import (
    DEMONSTRATION_SEEDS,
    DEMONSTRATION_SEEDS_UNKNOWN,
    RUN_KEY,
)
from embodichain.core.training.strategies import Snapshot


@dataclass
class RunContext:
    """Where a run writes and who it is; `metrics` is set on rank 0 only."""

    directory: Path
    identity: dict[str, Any]  # run_id, factory, config, config_sha256, source_identity, ...
    metrics: MetricsWriter | None = None


class Checkpointed(Protocol):
    """What of a trainer goes into its checkpoints (a `SupervisedTrainer` is one)."""

    step: int
    learner: Learner
    sampler: Sampler
    tracker: BestTracker
    last_metrics: dict[str, float]
    callbacks: list[Any]
    run: RunContext | None
    validation_due: bool


class Checkpointing:
    """Captures, writes, prunes and restores a trainer's snapshots."""

    def __init__(self, trainer: TrainerConfig, device: torch.device) -> None:
        self.device = device
        self.keep_last = trainer.keep_last
        self.writer = CheckpointWriter(trainer.async_save)
        self.clock = SaveClock(trainer.save_every_s)  # rank 0's clock (R-CKPT-9)
        self._validating = False
        self._deferred: list[Path] = []

    def rank_zero_note(self) -> float:
        """Rank 0's note for the next update's all-reduce: a time-based save is due, or a
        background save failed (0 on other ranks)."""
        return (rank_zero_note(self.writer, self.clock) if process_group.is_rank_zero()
                else 0.0)

    def save(self, trainer: Checkpointed, path: Path) -> Path:
        """Write a snapshot of `trainer` to `path` (a step file also as last.pt).

        Collective, except during validation (a callback on rank 0): then the save is
        written by every rank as validation ends.
        """
        if self._validating:
            self._deferred.append(path)
            return path
        also_last = self.also_last(trainer, path)
        # One save in flight at most: each rank first waits for its previous one, which may
        # have failed (rank 0's failure is every rank's through `end_save`).
        failure = self.writer.settle()
        trainer.learner.settle()  # the last update's skip finished: its state is final
        job = trainer.learner.strategy.save_job(trainer.learner,
                                                self._snapshot(trainer, path, also_last))
        if failure is None and job is not None:
            self.writer.write(job)
            failure = None if self.writer.background else self.writer.failure
        return self.end_save(trainer, path, failure, also_last)

    @staticmethod
    def also_last(trainer: Checkpointed, path: Path) -> bool:
        """Whether `path` is a step file of the run's directory (written also as last.pt)."""
        return step_of(path.name) is not None and path.parent == require_run(trainer).directory

    def end_save(self, trainer: Checkpointed, path: Path, failure: SaveFailure | None,
                 also_last: bool) -> Path:
        """Every rank stops on a failed save; a written last.pt restarts the save clock."""
        self.stop_if_failed(failure, trainer.step)
        if also_last or path.name == LAST:
            self.clock.restart()
        return path

    @contextlib.contextmanager
    def validating(self, trainer: Checkpointed) -> Iterator[None]:
        """While validating (every rank): saves wait for its end, then every rank writes
        them together. Not after a failure that stops this rank: its peers may be inside a
        collective of the validation itself."""
        self._validating = True
        try:
            yield
        except BaseException:
            self._validating, self._deferred = False, []
            raise
        self._validating = False
        deferred = process_group.broadcast_from_rank_zero(
            [str(p) for p in self._deferred] if process_group.is_rank_zero() else None)
        self._deferred = []
        for path in deferred:
            self.save(trainer, Path(path))

    def _snapshot(self, trainer: Checkpointed, path: Path, also_last: bool) -> Snapshot:
        run = require_run(trainer)
        own = {"rng": capture_rng(self.device), "sampler": trainer.sampler.state_dict(),
               "buffers": capture_buffers(trainer.learner.model)}
        payload, durable = None, None
        if process_group.is_rank_zero():
            payload = {"run": {**run.identity, "step": trainer.step,
                               "metrics": dict(trainer.last_metrics),
                               "best_tracker": trainer.tracker.state_dict(),
                               # a stop skipped or cut short this update's validation: the
                               # resume runs it first (R-EVAL-4)
                               **({"validation_due": True} if trainer.validation_due
                                  else {}),
                               # what the model is rebuilt from without the data (R-EVAL-5)
                               **({RUN_KEY: trainer.model_facts}
                                  if getattr(trainer, "model_facts", None) else {}),
                               **({DEMONSTRATION_SEEDS: trainer.demonstration_seeds}
                                  if getattr(trainer, "demonstration_seeds", None) else {}),
                               **({DEMONSTRATION_SEEDS_UNKNOWN: trainer.unknown_seeds}
                                  if getattr(trainer, "unknown_seeds", None) else {})},
                       "callbacks": {key: cb.state_dict() for key, cb in keyed_callbacks(trainer)
                                     if hasattr(cb, "state_dict")}}
            path.parent.mkdir(parents=True, exist_ok=True)
            metrics = run.metrics  # durable up to this step before the snapshot is published;
            durable = (None if metrics is None  # from the writer's thread: fsync, never write
                       else metrics.fsync if self.writer.background else metrics.sync)
        return Snapshot(trainer.step, path, run.directory, run.identity, own, payload,
                        also_as=path.parent / LAST if also_last else None,
                        before_publish=durable,
                        after_publish=(lambda: self._apply_retention(path.parent))
                        if also_last else None)

    def settle(self) -> SaveFailure | None:
        """Wait for this rank's save in flight; its failure, if it failed."""
        return self.writer.settle()

    def stop_if_failed(self, failure: SaveFailure | None, step: int) -> None:
        """Every rank stops, naming the file and the reason, when a save failed on rank 0."""
        process_group.raise_if_rank_zero_failed(
            failure.reason if failure else None, failure.what if failure else "",
            f"rank 0 at update {step}")

    def _apply_retention(self, directory: Path) -> None:
        if self.keep_last is None:
            return
        for _, old in step_files(directory)[:-self.keep_last]:
            old.unlink(missing_ok=True)

    def restore(self, trainer: Checkpointed, payload: Mapping[str, Any]) -> None:
        """Load a verified checkpoint payload; each rank takes its own saved state."""
        trainer.learner.settle()  # nothing of an update in flight is put back over it
        mine = trainer.learner.strategy.restore(trainer.learner, payload)
        restore_rank_and_run(trainer, mine, payload, self.device)


def restore_rank_and_run(trainer: Checkpointed, mine: Mapping[str, Any],
                         payload: Mapping[str, Any], device: torch.device) -> None:
    """This rank's own state (`mine`: sampler, buffers, RNG streams), the callbacks' and the
    run's (step, last metrics, best-metric standing), after the learner's is loaded."""
    trainer.sampler.load_state_dict(mine["sampler"])
    restore_buffers(trainer.learner.model, mine["buffers"])
    step, rank = int(payload["run"]["step"]), process_group.rank()
    if int(payload["run"]["world_size"]) == process_group.world_size():
        restore_rng(mine["rng"], device)
    else:  # another world size (R-ELASTIC-3): the old streams were other ranks'
        seed = int((payload["run"].get("config") or {}).get("seed", 0))
        seed_streams(continued_stream_seed(seed, step, rank))
    saved = payload.get("callbacks") or {}
    for key, callback in keyed_callbacks(trainer):
        state = saved.get(key)
        if state is not None and hasattr(callback, "load_state_dict"):
            callback.load_state_dict(state)
    trainer.step = int(payload["run"]["step"])
    trainer.last_metrics = dict(payload["run"].get("metrics") or {})
    trainer.tracker.load_state_dict(payload["run"].get("best_tracker"))
    trainer.validation_due = bool(payload["run"].get("validation_due", False))


def keyed_callbacks(trainer: Checkpointed) -> list[tuple[str, Any]]:
    """Callbacks under checkpoint keys `"{index}:{class}"`: a callback's state only ever
    goes back to a callback of the same kind at the same position."""
    return [(f"{i}:{type(cb).__qualname__}", cb) for i, cb in enumerate(trainer.callbacks)]


def require_run(trainer: Checkpointed) -> RunContext:
    if trainer.run is None:
        raise RuntimeError("no run directory attached: build the trainer with "
                           "embodichain.learning.sl.build_trainer(recipe, device) (or "
                           "launch through `embodichain train-sl`)")
    return trainer.run
