"""`trainer.strategy: ddp`: every rank holds the whole model (R-DIST-3, R-LOOP-1).

Each rank back-propagates its weighted sum `w_r * l_r`; a DDP communication hook appends
the local `[w_r, w_r * l_r, w_r * m_r..., stop_r, note_r]` to every gradient bucket, so a
single all-reduce per bucket yields the gradient sums, the global weight (which it divides
by), whether any rank was asked to stop (R-SIG-1) and rank 0's note about saves
(R-CKPT-8/9). That is one collective per update instead of the two (weight, then
gradients) of a hand-written loop, and a stop costs no collective of its own. Under
accumulation the first K-1 backward passes run under DDP's `no_sync`, so the hook runs once.

A checkpoint is one file written by rank 0: the learner's state (the same on every rank)
and every rank's own state, gathered to rank 0 at the save; on another world size (under
`trainer.global_batch_size`) every new rank continues from old rank 0's. Validation runs on rank 0
alone, on the unwrapped model, while the other ranks wait (R-VAL-1).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from embodichain.core.checkpoint.rank_state import continued_from
from embodichain.core.checkpoint.tensor_names import refuse_other_tensors
from embodichain.core.checkpoint.writer import FileSave
from embodichain.core.distributed import process_group
from embodichain.core.training.ema import Ema
from embodichain.core.training.precision import autocast, compiled
from embodichain.core.training.strategies.base import (
    Snapshot,
    SpreadOptions,
    Strategy,
    Trained,
)

# torch >= 2.12 renamed `broadcast_buffers`; both mean: no buffer broadcast in forward.
_DDP_PARAMETERS = inspect.signature(DistributedDataParallel).parameters
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_PARAMETERS
                   else {"broadcast_buffers": False})


class _Reduced:
    """The global statistics of the last update, written by the hook's future."""

    value: torch.Tensor | None = None


class _ReduceState:
    """What the communication hook reads (local statistics) and writes (global ones)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.local: torch.Tensor | None = None
        self.reduced = _Reduced()


def _weighted_allreduce_hook(state, bucket):  # DDP checks these annotations at run time
    """Comm hook: all-reduce `[grads, weight, weighted sums]`, return `grads / weight`."""
    grads = bucket.buffer()
    n = grads.numel()
    packed = torch.cat([grads, state.local.to(grads.dtype)])
    work = dist.all_reduce(packed, group=state.group, async_op=True)
    # `finish` runs on gloo's worker thread, which lets go of it when it next gets the GIL,
    # maybe after `release()` and the group's destruction: were it to hold the state (and so
    # the group), the group's last reference would go there, and its destructor would join
    # that very thread (SIGABRT, "Resource deadlock avoided"). It holds the result only.
    reduced = state.reduced

    def finish(fut: torch.futures.Future[Any]) -> torch.Tensor:
        total = fut.value()[0]
        reduced.value = total[n:]
        weight = total[n].clamp_min(torch.finfo(total.dtype).tiny)  # zero weight: zero grads
        return total[:n].div_(weight)

    return work.get_future().then(finish)


class DdpStrategy(Strategy):
    """The whole model on every rank; gradients all-reduced by DDP (none in one process)."""

    name = "ddp"

    def __init__(self, device: torch.device, precision: str,
                 options: SpreadOptions | None = None) -> None:
        super().__init__(device, precision, options)
        self._model: nn.Module | None = None
        self._parameters: list[nn.Parameter] = []
        self._ddp: DistributedDataParallel | None = None
        self._reduce = _ReduceState(dist.group.WORLD if process_group.is_distributed()
                                    else None)

    def prepare(self, model: nn.Module, param_groups: Sequence[dict[str, Any]] | None
                ) -> Sequence[dict[str, Any]] | None:
        self._model = model
        self._parameters = list(model.parameters())  # not walked again every update
        return param_groups

    def make_ema(self, model: nn.Module, decay: float) -> Ema:
        return Ema(model, decay)

    def wrap(self, model: nn.Module, *, compile: bool) -> nn.Module:
        # Compiled, the model trains through the compiled module; the plain one (saved,
        # validated, averaged) shares its parameters.
        trained = compiled(model, self.device) if compile else model
        if not process_group.is_distributed():
            return trained
        ddp = DistributedDataParallel(
            trained, device_ids=[self.device] if self.device.type == "cuda" else None,
            # Buffers are per-rank state (saved per rank); syncing them would also cost a
            # collective per forward.
            **_NO_BUFFER_SYNC)
        ddp.register_comm_hook(self._reduce, _weighted_allreduce_hook)
        self._ddp = ddp
        return ddp

    # -- the update --------------------------------------------------------------------

    @contextlib.contextmanager
    def micro_batch(self, last: bool):
        with (self._ddp.no_sync() if self._ddp is not None and not last
              else contextlib.nullcontext()):
            with autocast(self.precision, self.device):
                yield

    def before_last_backward(self, totals: torch.Tensor) -> None:
        self._reduce.local = totals  # the comm hook sends it with the gradients

    def reduce(self, totals: torch.Tensor) -> torch.Tensor:
        if self._ddp is not None:
            return self._reduce.reduced.value
        # One process: the same arithmetic, locally.
        weight = totals[0].clamp_min(torch.finfo(totals.dtype).tiny)
        grads = [p.grad for p in self._parameters if p.grad is not None]
        torch._foreach_div_(grads, weight)
        return totals

    # -- checkpoints -------------------------------------------------------------------

    def learner_state(self, learner: Trained) -> dict[str, Any]:
        """Model (unwrapped), optimizer, schedule, scaler and EMA: the same on every rank."""
        return {
            "model": learner.model.state_dict(),
            "optimizer": learner.optimizer.state_dict(),
            "scheduler": learner.scheduler.state_dict(),
            "grad_scaler": learner.scaler.state_dict(),
            **({"ema": learner.ema.state_dict()} if learner.ema is not None else {}),
        }

    def load_learner_state(self, learner: Trained, state: Mapping[str, Any]) -> None:
        refuse_other_tensors(learner.model.state_dict(), state["model"], "the checkpoint")
        learner.model.load_state_dict(state["model"])
        learner.optimizer.load_state_dict(state["optimizer"])
        learner.scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            learner.scaler.load_state_dict(state["grad_scaler"])
        if learner.ema is not None:
            if "ema" not in state:
                raise ValueError("the checkpoint holds no EMA weights (trained without "
                                 "trainer.ema)")
            learner.ema.load_state_dict(state["ema"])

    def save_job(self, learner: Trained, snapshot: Snapshot) -> FileSave | None:
        """Every rank's own state gathered to rank 0, which writes the one file."""
        with process_group.waiting_for_others(f"the state of update {snapshot.step}",
                                              on_rank_zero=True):
            gathered = process_group.gather_to_rank_zero(snapshot.own)
        if gathered is None or snapshot.payload is None:
            return None
        payload = {"run": snapshot.payload["run"], "learner": self.learner_state(learner),
                   "ranks": dict(enumerate(gathered)),
                   "callbacks": snapshot.payload["callbacks"]}
        return FileSave(payload, snapshot.path, also_as=snapshot.also_as,
                        before_publish=snapshot.before_publish,
                        after_publish=snapshot.after_publish)

    def receive(self, payload: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0 sends the common state to every rank and each rank only its own part."""
        common = ({k: v for k, v in payload.items() if k != "ranks"} if payload is not None
                  else None)
        common = process_group.broadcast_from_rank_zero(common)
        self.check_format(common)  # every rank refuses alike, before rank 0 reads "ranks"
        world_size = process_group.world_size()
        parts = ([payload["ranks"][continued_from(r, world_size, len(payload["ranks"]))]
                  for r in range(world_size)] if payload is not None else None)
        own = process_group.scatter_from_rank_zero(parts)
        return {**common, "ranks": {process_group.rank(): own}}

    def restore(self, learner: Trained, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        self.check_format(payload)
        self.load_learner_state(learner, payload["learner"])
        return payload["ranks"][process_group.rank()]

    # -- validation and the end --------------------------------------------------------

    def validate(self, evaluate: Callable[[], dict[str, float]], step: int
                 ) -> dict[str, float] | None:
        """Rank 0 alone; the other ranks wait for its outcome."""
        return evaluate() if process_group.is_rank_zero() else None

    def release(self) -> None:
        """Drop the DDP wrapper and our reference to the group, so that both are freed
        before the process group is destroyed (torch can abort at exit otherwise)."""
        self._ddp = None
        self._reduce = _ReduceState(None)
