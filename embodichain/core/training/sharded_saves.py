"""The trainer's saves and restores under `trainer.strategy: fsdp` (R-SHARD-2, R-SHARD-3).

A save is collective: rank 0 picks the save's token (so shard names are unique), every rank
captures its shard (its local shards of model, optimizer and EMA, its RNG streams, sampler
and buffers) and hands it to its `ShardedWriter`, and rank 0 adds the manifest's payload
(run identity, metrics, schedule, callbacks). No rank ever holds the full state.

A restore verifies every rank's shard against the manifest before any rank loads anything:
each rank checks its own (on several machines, each node reads its own copy of the run
directory), and all learn every problem, so all refuse with the same message naming the
missing or damaged shards and their hosts.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embodichain.core.checkpoint.file import LAST
from embodichain.core.checkpoint.rank_state import (
    capture_buffers,
    capture_rng,
    restore_buffers,
    restore_rng,
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
from embodichain.core.checkpoint.writer import SaveFailure
from embodichain.core.distributed import process_group as dist_utils
from embodichain.core.errors import CheckpointError

if TYPE_CHECKING:
    from embodichain.core.training.trainer import SupervisedTrainer


def save_sharded(trainer: SupervisedTrainer, path: Path, also_last: bool
                 ) -> SaveFailure | None:
    """Write a sharded checkpoint of the current state at `path` (collective, every rank).

    Returns the failure every rank knows of (an earlier background save's, or this one's
    when written inline), else None.
    """
    writer = trainer._saves
    assert isinstance(writer, ShardedWriter)
    failure = writer.settle()  # one save in flight at most; every rank learnt its outcome
    if failure is not None:
        return failure
    token = dist_utils.broadcast_from_rank_zero(secrets.token_hex(4)
                                                if dist_utils.is_rank_zero() else None)
    run = trainer._require_run()
    learner, rank = trainer.learner, dist_utils.rank()
    identity = {"step": trainer.step, "run_id": run.identity.get("run_id"),
                "world_size": dist_utils.world_size(),
                "config_sha256": run.identity["config_sha256"]}
    rank_state = {"rng": capture_rng(trainer.device), "sampler": trainer.sampler.state_dict(),
                  "buffers": capture_buffers(learner.model)}
    ema = learner.ema.state_dict() if learner.ema is not None else None
    shard = shard_state(learner.model, learner.optimizer, ema, rank_state)
    manifest = None
    metrics = run.metrics
    durable = None
    if dist_utils.is_rank_zero():
        manifest = {
            "run": {**run.identity, "step": trainer.step, "metrics": dict(trainer.last_metrics),
                    "best_tracker": trainer.tracker.state_dict()},
            "learner": learner.state_dict(),
            "callbacks": {key: cb.state_dict() for key, cb in trainer._keyed_callbacks()
                          if hasattr(cb, "state_dict")},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        durable = (None if metrics is None  # from the writer's thread: fsync, never write
                   else metrics.fsync if writer.background else metrics.sync)
    writer.write(run.directory, shard_relpath(trainer.step, token, rank), identity, shard,
                 manifest, path, also_as=path.parent / LAST if also_last else None,
                 before_publish=durable,
                 after_publish=(lambda: trainer._apply_retention(path.parent))
                 if also_last else None)
    return None if writer.background else writer.failure


def restore_sharded(trainer: SupervisedTrainer, payload: Mapping[str, Any]) -> None:
    """Load a sharded manifest's payload (every rank has it) and this rank's shard."""
    sharded = trainer.learner.sharded
    data = {"manifest": {"world_size": int(payload["run"]["world_size"])},
            "payload": payload}
    where = payload.get("sharded", {}).get(SHARD_DIRECTORY, "the checkpoint")
    check_compatible(data, where, "fsdp" if sharded else "ddp", dist_utils.world_size())
    directory = Path(payload["sharded"][SHARD_DIRECTORY])
    rank = dist_utils.rank()
    shard, problem = None, None
    try:
        shard = read_shard(directory, data, rank)["payload"]
    except CheckpointError as exc:
        problem = str(exc)
    everyone = dist_utils.broadcast_from_rank_zero(dist_utils.gather_to_rank_zero(problem))
    problems = [p for p in everyone if p is not None]
    if problems:
        hosts = {r: e.get("host") for r, e in shard_table(data).items()}
        raise CheckpointError(f"cannot resume from the sharded checkpoint in {directory} "
                              f"(shards written on {sorted(set(hosts.values()))}): "
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
    mine = shard["rank_state"]
    trainer.sampler.load_state_dict(mine["sampler"])
    restore_buffers(learner.model, mine["buffers"])
    restore_rng(mine["rng"], trainer.device)
    trainer._restore_common(payload)
