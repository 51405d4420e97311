"""`trainer.strategy: fsdp`: parameters, gradients and optimizer state sharded over the
ranks with FSDP2 (R-SHARD-1..3).

The update is DDP's weighted one: every backward but the last accumulates locally; the last
reduce-scatters the summed gradients (SUM, core/distributed/sharding.py), the statistics
and flags take one small all-reduce of their own, and each gradient shard is divided by the
global weight. Mixed precision is FSDP2's own policy, so the forward has no autocast. The
EMA is sharded like the model (sharded_ema.py).

A checkpoint is a manifest and one shard per rank (core/checkpoint/sharded.py): rank 0
picks the save's token (so shard names are unique), every rank hands its writer its shard
(its local shards of model, optimizer and EMA, and its own state) and rank 0 adds the
manifest's payload. No rank ever holds the full state. A restore verifies every rank's
shard before any rank loads anything: each rank checks its own (on several machines, each
node reads its own copy of the run directory) and all learn every problem, so all refuse
with the same message naming the missing or damaged shards and their hosts. A checkpoint of
another world size is re-cut on load (core/checkpoint/recut.py): each rank copies only its
rows out of the memory-mapped old shards (or receives them from a rank that holds an old
shard its node lacks), after every old shard's file digest is verified.

Validation runs on every rank (the sharded forward is collective); a failure on any rank
stops that rank at once with its message, without entering another collective, and the
launcher then ends the others (R-STRAT-2).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from embodichain.core.checkpoint.formats import SHARDED
from embodichain.core.checkpoint.recut import restore_recut
from embodichain.core.checkpoint.recut_exchange import own_shards
from embodichain.core.checkpoint.sharded import (
    SHARD_DIRECTORY,
    read_shard,
    restore_shard,
    shard_relpath,
    shard_state,
    shard_table,
)
from embodichain.core.checkpoint.sharded_writer import (
    ShardSave,
    release_save_group,
    save_group,
)
from embodichain.core.distributed import process_group, sharding
from embodichain.core.errors import CheckpointError
from embodichain.core.training.sharded_ema import ShardedEma
from embodichain.core.training.strategies.base import (
    Snapshot,
    SpreadOptions,
    Strategy,
    Trained,
    ValidationFailed,
)

# How long a rank whose validation failed looks for a peer's word first. A peer that failed
# before it left its word before it stopped, so it is there at once; this only covers the
# store's round trip on a loaded machine.
PEER_WORD_S = 1.0


class FsdpStrategy(Strategy):
    """FSDP2 over every rank (a one-rank group of its own in a single process)."""

    name = "fsdp"
    checkpoint_format = SHARDED
    collective_forward = True  # each block all-gathers its parameters

    def __init__(self, device: torch.device, precision: str,
                 options: SpreadOptions | None = None) -> None:
        super().__init__(device, precision, options)
        self._model: nn.Module | None = None
        self._owns_group = False
        self._save_group: Any = None

    def prepare(self, model: nn.Module, param_groups: Sequence[dict[str, Any]] | None
                ) -> Sequence[dict[str, Any]] | None:
        """Shard `model` in place (its parameters become DTensor shards); the factory's
        parameter groups, which name the old parameters, rebuilt on the new ones."""
        self._owns_group = sharding.one_rank_group(self.device)
        names = {id(p): n for n, p in model.named_parameters()}
        by_name = []
        for i, group in enumerate(param_groups or ()):
            params = list(group.get("params", ()))
            if any(id(p) not in names for p in params):
                raise ValueError(f"param_groups[{i}] holds a tensor that is not a parameter "
                                 "of the model")
            by_name.append((group, [names[id(p)] for p in params]))
        sharding.shard_model(model, self.device, blocks=self.options.shard_blocks,
                             precision=self.precision,
                             reshard_after_forward=self.options.reshard_after_forward)
        self._model = model
        self._save_group = save_group()  # every rank, at the same point
        if param_groups is None:
            return None
        now = dict(model.named_parameters())
        return [{**group, "params": [now[n] for n in listed]} for group, listed in by_name]

    def make_ema(self, model: nn.Module, decay: float) -> ShardedEma:
        return ShardedEma(model, decay)

    def wrap(self, model: nn.Module, *, compile: bool) -> nn.Module:
        return model  # compile is refused with fsdp when the recipe is validated

    # -- the update --------------------------------------------------------------------

    @contextlib.contextmanager
    def micro_batch(self, last: bool):
        sharding.set_gradient_sync(self._model, last)
        yield

    def reduce(self, totals: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(totals)
        sharding.divide_gradients(self._model.parameters(), totals[0])
        return totals

    # -- checkpoints -------------------------------------------------------------------

    def learner_state(self, learner: Trained) -> dict[str, Any]:
        """Only the schedule and scaler (the same on every rank): the model, optimizer and
        EMA are each rank's own shards."""
        return {"scheduler": learner.scheduler.state_dict(),
                "grad_scaler": learner.scaler.state_dict()}

    def load_learner_state(self, learner: Trained, state: Mapping[str, Any]) -> None:
        learner.scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            learner.scaler.load_state_dict(state["grad_scaler"])

    def save_job(self, learner: Trained, snapshot: Snapshot) -> ShardSave:
        """This rank's shard; on rank 0 also the manifest's payload."""
        token = process_group.broadcast_from_rank_zero(
            secrets.token_hex(4) if process_group.is_rank_zero() else None)
        rank = process_group.rank()
        identity = {"step": snapshot.step, "run_id": snapshot.identity.get("run_id"),
                    "world_size": process_group.world_size(),
                    "config_sha256": snapshot.identity["config_sha256"]}
        ema = learner.ema.state_dict() if learner.ema is not None else None
        shard = shard_state(learner.model, learner.optimizer, ema, snapshot.own)
        manifest = None
        if snapshot.payload is not None:
            manifest = {"run": snapshot.payload["run"], "learner": self.learner_state(learner),
                        "callbacks": snapshot.payload["callbacks"]}
        return ShardSave(snapshot.directory, shard_relpath(snapshot.step, token, rank),
                         identity, shard, manifest, snapshot.path, also_as=snapshot.also_as,
                         before_publish=snapshot.before_publish,
                         after_publish=snapshot.after_publish, group=self._save_group)

    def receive(self, payload: dict[str, Any] | None) -> dict[str, Any]:
        """The manifest's payload, on every rank (each reads its own shard file)."""
        common = process_group.broadcast_from_rank_zero(payload)
        self.check_format(common)
        return common

    def restore(self, learner: Trained, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """Verify every rank's shard (collective), then load this rank's (read on its node,
        or sent whole by a rank of a node that holds it: recut_exchange). Saved by another
        world size (allowed by `check_format`): the old shards are re-cut (recut.py) and
        old rank 0's own state is returned (from which the trainer derives this rank's)."""
        self.check_format(payload)
        if int(payload["run"]["world_size"]) != process_group.world_size():
            rank_state = restore_recut(learner.model, learner.optimizer, learner.ema, payload)
            self.load_learner_state(learner, payload["learner"])
            return rank_state
        directory = Path(payload["sharded"][SHARD_DIRECTORY])
        data = {"manifest": {"world_size": int(payload["run"]["world_size"])},
                "payload": payload}
        shard, problem = own_shards(shard_table(data), directory,
                                    lambda k: read_shard(directory, data, k)["payload"])
        everyone = process_group.broadcast_from_rank_zero(
            process_group.gather_to_rank_zero(problem))
        problems = [p for p in everyone if p is not None]
        if problems:
            hosts = sorted({str(e.get("host")) for e in shard_table(data).values()})
            raise CheckpointError(f"cannot resume from the sharded checkpoint in {directory} "
                                  f"(shards written on {', '.join(hosts)}): "
                                  + "; ".join(problems) + ". Nothing was loaded.")
        assert shard is not None
        restore_shard(learner.model, learner.optimizer, shard)
        self.load_learner_state(learner, payload["learner"])
        if learner.ema is not None:
            if shard.get("ema") is None:
                raise CheckpointError("the checkpoint holds no EMA weights (trained without "
                                      "trainer.ema)")
            learner.ema.load_state_dict(shard["ema"])
        return shard["rank_state"]

    # -- validation and the end --------------------------------------------------------

    def validate(self, evaluate: Callable[[], dict[str, float]], step: int
                 ) -> dict[str, float] | None:
        """Every rank runs `evaluate` (its forward is collective). A rank whose evaluate
        fails stops at once, naming itself: waiting in another collective could hang it
        behind a peer still inside the forward's all-gather. It first leaves its message in
        the group's store; a peer whose forward then loses the connection to it stops with
        that message (the cause), not with its own lost connection: so rank 0 records the
        failing rank's words in run.json (R-STRAT-2)."""
        try:
            metrics = evaluate()
        except Exception as exc:
            cause = process_group.failure_left_by_peers(wait_s=PEER_WORD_S)
            if cause is None:
                cause = (f"validation failed on rank {process_group.rank()} at update {step}: "
                         f"{type(exc).__name__}: {exc}")
                process_group.leave_failure(cause)
            raise ValidationFailed(cause) from exc
        return metrics if process_group.is_rank_zero() else None

    def release(self) -> None:
        """Free the save group and, in one process, the one-rank group created here."""
        release_save_group(self._save_group)
        self._save_group = None
        if self._owns_group:
            self._owns_group = False
            dist.destroy_process_group()
