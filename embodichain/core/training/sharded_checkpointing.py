"""A trainer's snapshots under `trainer.strategy: fsdp` (R-SHARD-2, R-SHARD-3).

`ShardedCheckpointing` is `Checkpointing` with sharded files: a save is collective; rank 0
picks the save's token (so shard names are unique), every rank captures its shard (its
local shards of model, optimizer and EMA, its RNG streams, sampler and buffers) and hands it
to its `ShardedWriter`, and rank 0 adds the manifest's payload (run identity, metrics,
schedule, callbacks). No rank ever holds the full state. A callback's save during
validation (best.pt) cannot be one rank's: it is written by every rank as validation ends.

A restore verifies every rank's shard against the manifest before any rank loads anything:
each rank checks its own (on several machines, each node reads its own copy of the run
directory), and all learn every problem, so all refuse with the same message naming the
missing or damaged shards and their hosts.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.names import LAST
from embodichain.core.checkpoint.rank_state import (
    capture_buffers,
    capture_rng,
)
from embodichain.core.checkpoint.sharded import (
    SHARD_DIRECTORY,
    check_compatible,
    read_shard,
    restore_shard,
    shard_relpath,
    shard_state,
    shard_table,
)
from embodichain.core.checkpoint.sharded_writer import ShardedWriter
from embodichain.core.distributed import process_group
from embodichain.core.errors import CheckpointError, UsageError
from embodichain.core.recipe.schema import FrameworkConfig, TrainerConfig
from embodichain.core.training.checkpointing import (
    Checkpointed,
    Checkpointing,
    keyed_callbacks,
    require_run,
    restore_rank_and_run,
)


class ShardedCheckpointing(Checkpointing):
    """Every rank writes and reads its own shard; rank 0 the manifest."""

    def __init__(self, trainer: TrainerConfig, device: torch.device) -> None:
        super().__init__(trainer, device)
        self.writer: ShardedWriter = ShardedWriter(trainer.async_save)  # type: ignore[assignment]
        self._validating = False
        self._deferred: list[Path] = []

    def save(self, trainer: Checkpointed, path: Path) -> Path:
        """Write a sharded snapshot at `path` (collective); during validation, on rank 0,
        remember it for every rank to write when validation ends."""
        if self._validating:
            self._deferred.append(path)
            return path
        also_last = self.also_last(trainer, path)
        failure = self.writer.settle()  # one in flight at most; every rank learnt its end
        if failure is None:
            self._write_sharded(trainer, path, also_last)
            failure = None if self.writer.background else self.writer.failure
        return self.end_save(trainer, path, failure, also_last)

    @contextlib.contextmanager
    def committed(self, trainer: Checkpointed) -> Iterator[None]:
        """While validating (every rank): saves are deferred to its end, then written by
        every rank (validation changes no training state, so it is the same state)."""
        self._validating = True
        try:
            yield
        finally:
            self._validating = False
            deferred = process_group.broadcast_from_rank_zero(
                [str(p) for p in self._deferred] if process_group.is_rank_zero() else None)
            self._deferred = []
            for path in deferred:
                self.save(trainer, Path(path))

    def _write_sharded(self, trainer: Checkpointed, path: Path, also_last: bool) -> None:
        token = process_group.broadcast_from_rank_zero(
            secrets.token_hex(4) if process_group.is_rank_zero() else None)
        run = require_run(trainer)
        learner, rank = trainer.learner, process_group.rank()
        identity = {"step": trainer.step, "run_id": run.identity.get("run_id"),
                    "world_size": process_group.world_size(),
                    "config_sha256": run.identity["config_sha256"]}
        rank_state = {"rng": capture_rng(self.device), "sampler": trainer.sampler.state_dict(),
                      "buffers": capture_buffers(learner.model)}
        ema = learner.ema.state_dict() if learner.ema is not None else None
        shard = shard_state(learner.model, learner.optimizer, ema, rank_state)
        manifest, durable = None, None
        if process_group.is_rank_zero():
            manifest = {
                "run": {**run.identity, "step": trainer.step,
                        "metrics": dict(trainer.last_metrics),
                        "best_tracker": trainer.tracker.state_dict()},
                "learner": learner.state_dict(),
                "callbacks": {key: cb.state_dict() for key, cb in keyed_callbacks(trainer)
                              if hasattr(cb, "state_dict")},
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            metrics = run.metrics  # durable up to this step before the manifest appears
            durable = (None if metrics is None
                       else metrics.fsync if self.writer.background else metrics.sync)
        self.writer.write(run.directory, shard_relpath(trainer.step, token, rank), identity,
                          shard, manifest, path,
                          also_as=path.parent / LAST if also_last else None,
                          before_publish=durable,
                          after_publish=(lambda: self._apply_retention(path.parent))
                          if also_last else None)

    def restore(self, trainer: Checkpointed, payload: Mapping[str, Any]) -> None:
        """Load a sharded manifest's payload (every rank has it) and this rank's shard."""
        restore_sharded(trainer, payload, self.device)

    def release(self) -> None:
        """Free the writer's process group (before the default group goes)."""
        self.writer.release()


def restore_sharded(trainer: Checkpointed, payload: Mapping[str, Any],
                    device: torch.device) -> None:
    """Verify every rank's shard (collective), then load this rank's."""
    data = {"manifest": {"world_size": int(payload["run"]["world_size"])},
            "payload": payload}
    where = payload.get("sharded", {}).get(SHARD_DIRECTORY, "the checkpoint")
    check_compatible(data, where, "fsdp" if trainer.learner.sharded else "ddp",
                     process_group.world_size())
    directory = Path(payload["sharded"][SHARD_DIRECTORY])
    shard, problem = None, None
    try:
        shard = read_shard(directory, data, process_group.rank())["payload"]
    except CheckpointError as exc:
        problem = str(exc)
    everyone = process_group.broadcast_from_rank_zero(
        process_group.gather_to_rank_zero(problem))
    problems = [p for p in everyone if p is not None]
    if problems:
        hosts = sorted({str(e.get("host")) for e in shard_table(data).values()})
        raise CheckpointError(f"cannot resume from the sharded checkpoint in {directory} "
                              f"(shards written on {', '.join(hosts)}): "
                              + "; ".join(problems) + ". Nothing was loaded.")
    assert shard is not None
    learner = trainer.learner
    restore_shard(learner.model, learner.optimizer, shard)
    learner.load_state_dict(payload["learner"])
    if learner.ema is not None:
        if shard.get("ema") is None:
            raise CheckpointError("the checkpoint holds no EMA weights (trained without "
                                  "trainer.ema)")
        learner.ema.load_state_dict(shard["ema"])
    restore_rank_and_run(trainer, shard["rank_state"], payload, device)

def check_strategy(config: FrameworkConfig) -> None:
    """What `trainer.strategy: fsdp` cannot be combined with yet (refused, exit 2)."""
    t = config.trainer
    if t.strategy != "fsdp":
        return
    if t.precision == "fp16":
        raise UsageError("trainer.precision: fp16 is not available with trainer.strategy: "
                         "fsdp (its gradient scaler is not sharded); use bf16 or fp32")
    if t.compile:
        raise UsageError("trainer.compile: true is not available with trainer.strategy: fsdp "
                         "yet; set trainer.compile: false")
