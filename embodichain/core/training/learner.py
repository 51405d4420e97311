"""The learner: model, optimizer, schedule, precision, and the weighted DDP update (R-DIST-3).

One optimizer update represents `sum_r(w_r * l_r) / sum_r(w_r)` over all ranks. Each rank
back-propagates its weighted sum `w_r * l_r`; a DDP communication hook appends the local
`[w_r, w_r * l_r, w_r * m_r..., stop_r, note_r]` to every gradient bucket, so a single
all-reduce per bucket yields the gradient sums, the global weight (which it divides by),
whether any rank was asked to stop (R-SIG-1) and rank 0's note about saves (R-CKPT-8/9).
That is one collective per update instead of the two (weight, then gradients) of a
hand-written loop, and a stop costs no collective of its own.

With `trainer.grad_accumulation: K` (R-LOOP-1) an update runs K micro-batches: the first
K-1 backward passes accumulate locally under DDP's `no_sync`, their statistics are summed,
and the hook runs once, on the last one, so the update is still
`sum_{r,k}(w_rk * l_rk) / sum_{r,k}(w_rk)` with one all-reduce.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from embodichain.core.distributed import sharding
from embodichain.core.distributed.process_group import is_distributed
from embodichain.core.recipe.schema import OptimizerConfig, SchedulerConfig
from embodichain.core.training.ema import Ema
from embodichain.core.training.nonfinite import nonfinite_loss
from embodichain.core.training.objective import LossResult, Objective, check_loss_result
from embodichain.core.training.param_groups import (
    ParamGroups,
    build_optimizer,
    build_param_groups,
)
from embodichain.core.training.precision import Precision, autocast, compiled
from embodichain.core.training.sharded_ema import ShardedEma

Batch = dict[str, torch.Tensor]


def lr_factor(config: SchedulerConfig | None, base_lr: float, max_updates: int
              ) -> Callable[[int], float]:
    """The multiplier of the base learning rate before update `step + 1`."""
    if config is None or config.name == "constant" and config.warmup_updates == 0:
        return lambda step: 1.0
    warmup = config.warmup_updates
    end = config.end_lr / base_lr if config.name != "constant" else 1.0
    decay_steps = max(1, max_updates - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / decay_steps)
        if config.name == "linear":
            return 1.0 + (end - 1.0) * progress
        if config.name == "cosine":
            return end + (1.0 - end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


# torch >= 2.12 renamed `broadcast_buffers`; both mean: no buffer broadcast in forward.
_DDP_PARAMETERS = inspect.signature(DistributedDataParallel).parameters
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False} if "forward_sync_buffers" in _DDP_PARAMETERS
                   else {"broadcast_buffers": False})


class _ReduceState:
    """What the communication hook reads (local statistics) and writes (global ones)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.local: torch.Tensor | None = None
        self.reduced: torch.Tensor | None = None


def _weighted_allreduce_hook(state, bucket):  # DDP checks these annotations at run time
    """Comm hook: all-reduce `[grads, weight, weighted sums]`, return `grads / weight`."""
    grads = bucket.buffer()
    n = grads.numel()
    packed = torch.cat([grads, state.local.to(grads.dtype)])
    work = dist.all_reduce(packed, group=state.group, async_op=True)

    def finish(fut: torch.futures.Future[Any]) -> torch.Tensor:
        total = fut.value()[0]
        state.reduced = total[n:]
        weight = total[n].clamp_min(torch.finfo(total.dtype).tiny)  # zero weight: zero grads
        return total[:n].div_(weight)

    return work.get_future().then(finish)


@dataclass(frozen=True)
class UpdateResult:
    """One update's global figures, the same on every rank.

    `metrics`: `loss` and the objective's metrics, weighted means over all ranks and
    micro-batches (empty when the global weight is 0). The rest are the control values that
    rode the update's all-reduce: `stop` is the sum of every rank's stop flag,
    `rank_zero_note` rank 0's note about saves (checkpoint/writer.py).
    """

    metrics: dict[str, float]
    weight: float
    skipped: bool  # the optimizer did not step: zero global weight, or a non-finite loss
    nonfinite: bool
    stop: float
    rank_zero_note: float

    @property
    def loss(self) -> float | None:
        return self.metrics.get("loss")


class Learner:
    """Owns the model (and its DDP wrap), optimizer, LR schedule, autocast and grad scaler."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig | None,
        max_updates: int,
        device: torch.device,
        precision: Precision = "fp32",
        *,
        param_groups: ParamGroups | None = None,
        ema_decay: float | None = None,
        compile: bool = False,
        strategy: str = "ddp",
        shard_blocks: Sequence[nn.Module] = (),
        reshard_after_forward: bool = True,
    ) -> None:
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
        self.device = device
        self.precision = precision
        self.strategy = strategy
        self.model = model.to(device).train()  # validation switches back after eval()
        self._owns_group = False
        if strategy == "fsdp":  # R-SHARD-1: parameters become DTensor shards, in place
            self._owns_group = sharding.one_rank_group(device)
            param_groups = _sharded(self.model, device, param_groups, shard_blocks,
                                    precision, reshard_after_forward)
            compile = False  # refused before (trainer), kept off here
        self.optimizer = build_optimizer(
            build_param_groups(self.model, optimizer, param_groups), optimizer)
        self.grad_clip = optimizer.grad_clip
        self.base_lr = optimizer.lr
        self._lr_factor = lr_factor(scheduler, optimizer.lr, max_updates)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.ema: Ema | ShardedEma | None = None
        if ema_decay is not None:
            self.ema = (ShardedEma(self.model, ema_decay) if self.sharded
                        else Ema(self.model, ema_decay))
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        self._reduce = _ReduceState(dist.group.WORLD if is_distributed() else None)
        # Compiled, the model trains through the compiled module; `self.model` (saved,
        # validated, averaged) stays the plain one, sharing its parameters.
        self.wrapped: nn.Module = compiled(self.model, device) if compile else self.model
        self._ddp: DistributedDataParallel | None = None
        if is_distributed() and not self.sharded:
            ddp = DistributedDataParallel(
                self.wrapped,
                device_ids=[device] if device.type == "cuda" else None,
                # Buffers are per-rank state (saved per rank); syncing them would also cost
                # a collective per forward.
                **_NO_BUFFER_SYNC,
            )
            ddp.register_comm_hook(self._reduce, _weighted_allreduce_hook)
            self.wrapped = self._ddp = ddp
        self.metric_names: list[str] | None = None
        self._flag_values = {0.0: torch.tensor(0.0, device=device)}  # the usual case, cached

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded with FSDP2 (`trainer.strategy: fsdp`)."""
        return self.strategy == "fsdp"

    @property
    def lr(self) -> float:
        """The schedule's current learning rate (that of a group with `lr_scale` 1)."""
        return self.base_lr * self._lr_factor(self.scheduler.last_epoch)

    def update(self, objective: Objective, batches: Batch | Sequence[Batch], *,
               stop: float = 0.0, rank_zero_note: float = 0.0) -> UpdateResult:
        """One optimizer update over one batch or a sequence of micro-batches.

        `stop` (this rank's stop flag) and `rank_zero_note` (rank 0's note to every rank: a
        time-based save is due, a background save failed) ride the update's all-reduce and
        come back summed over ranks.
        """
        flags = (stop, rank_zero_note)
        totals = self._accumulate(objective, [batches] if isinstance(batches, Mapping)
                                  else batches, flags)
        nonfinite = nonfinite_loss(totals)  # never step on it (trainer.on_nonfinite)
        skipped = totals[0] == 0.0 or nonfinite
        if not skipped:
            # A global batch with no weight does not step: Adam would still move parameters.
            if self.grad_clip is not None:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.ema is not None:
                self.ema.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._result(totals, skipped, nonfinite)

    def _accumulate(self, objective: Objective, micro_batches: Sequence[Batch],
                    flags: tuple[float, float]) -> list[float]:
        """Forward and backward of each micro-batch (R-LOOP-1); the global totals.

        Only the last backward synchronises: the comm hook then all-reduces the gradients
        accumulated over all micro-batches with their summed statistics and the flags.
        """
        if self.sharded:
            return self._accumulate_sharded(objective, micro_batches, flags)
        count = len(micro_batches)
        summed = None
        for k in range(count):
            last = k == count - 1
            with (self._ddp.no_sync() if self._ddp is not None and not last
                  else contextlib.nullcontext()):
                with autocast(self.precision, self.device):
                    result = check_loss_result(objective(self.wrapped, micro_batches[k]),
                                               objective)
                local = self._local_statistics(result)
                summed = local if summed is None else summed + local
                if last:
                    self._reduce.local = torch.cat([summed, self._flags(flags)])
                self.scaler.scale(result.loss.float() * local[0]).backward()
        if self._ddp is None:  # one process: reduce locally, same arithmetic
            self._reduce.reduced = self._reduce.local
            weight = summed[0].clamp_min(torch.finfo(summed.dtype).tiny)
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            torch._foreach_div_(grads, weight)
        return self._reduce.reduced.tolist()

    def _accumulate_sharded(self, objective: Objective, micro_batches: Sequence[Batch],
                            flags: tuple[float, float]) -> list[float]:
        """Under FSDP2: every backward but the last accumulates locally; the last one
        reduce-scatters the summed gradients (SUM). The statistics and flags then take one
        small all-reduce of their own, and each gradient shard is divided by the global
        weight: the same update as DDP's (R-SHARD-1). Mixed precision is FSDP2's policy, so
        there is no autocast."""
        count = len(micro_batches)
        summed = None
        for k in range(count):
            last = k == count - 1
            sharding.set_gradient_sync(self.model, last)
            result = check_loss_result(objective(self.wrapped, micro_batches[k]), objective)
            local = self._local_statistics(result)
            summed = local if summed is None else summed + local
            (result.loss.float() * local[0]).backward()
        totals = torch.cat([summed, self._flags(flags)])
        dist.all_reduce(totals)
        sharding.divide_gradients(self.model.parameters(), totals[0])
        self._reduce.reduced = totals
        return totals.tolist()

    def _local_statistics(self, result: LossResult) -> torch.Tensor:
        """`[w, w * loss, w * metric...]` of one micro-batch."""
        names = sorted(result.metrics)
        if self.metric_names is None:
            self.metric_names = names
        weight = torch.as_tensor(result.weight, dtype=torch.float32, device=self.device)
        values = [weight, result.loss.detach().float() * weight]
        values += [result.metrics[n].detach().float() * weight for n in self.metric_names]
        return torch.stack([v.reshape(()) for v in values])

    def _flags(self, flags: tuple[float, float]) -> torch.Tensor:
        """`[stop, rank_zero_note]` as the tensor that rides the update's all-reduce."""
        return torch.stack([self._flag_values[v] if v in self._flag_values
                            else torch.tensor(v, device=self.device) for v in flags])

    def _result(self, totals: list[float], skipped: bool, nonfinite: bool) -> UpdateResult:
        """The totals as weighted means (none when the weight is 0) and control values."""
        weight, stop, note = totals[0], totals[-2], totals[-1]
        metrics: dict[str, float] = {}
        if weight:
            metrics["loss"] = totals[1] / weight
            for name, value in zip(self.metric_names or [], totals[2:-2], strict=True):
                metrics[name] = value / weight
        return UpdateResult(metrics, weight, skipped, nonfinite, float(stop), float(note))

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Model (unwrapped), optimizer, schedule and scaler state: identical on every rank.

        Sharded, only the schedule and scaler (identical on every rank): the model,
        optimizer and EMA are each rank's own shards (checkpoint/sharded.py)."""
        if self.sharded:
            return {"scheduler": self.scheduler.state_dict(),
                    "grad_scaler": self.scaler.state_dict()}
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "grad_scaler": self.scaler.state_dict(),
            **({"ema": self.ema.state_dict()} if self.ema is not None else {}),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.sharded:
            self.scheduler.load_state_dict(state["scheduler"])
            if state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        if self.ema is not None:
            if "ema" not in state:
                raise ValueError("the checkpoint holds no EMA weights (trained without "
                                 "trainer.ema)")
            self.ema.load_state_dict(state["ema"])

    def release(self) -> None:
        """Drop the DDP wrapper and our reference to the group, so that both are freed
        before the process group is destroyed (torch can abort at exit otherwise)."""
        self.wrapped = self.model
        self._ddp = None
        self._reduce = _ReduceState(None)
        if self._owns_group:  # a sharded run in one process: its one-rank group
            self._owns_group = False
            dist.destroy_process_group()


def _sharded(model: nn.Module, device: torch.device, param_groups: ParamGroups | None,
             blocks: Sequence[nn.Module], precision: str, reshard_after_forward: bool
             ) -> list[dict[str, Any]] | None:
    """Shard `model` with FSDP2 (its parameters are replaced by DTensor shards); the
    factory's parameter groups, which name the old parameters, rebuilt on the new ones."""
    names = {id(p): n for n, p in model.named_parameters()}
    by_name = []
    for i, group in enumerate(param_groups or ()):
        params = list(group.get("params", ()))
        unknown = [p for p in params if id(p) not in names]
        if unknown:
            raise ValueError(f"param_groups[{i}] holds a tensor that is not a parameter of "
                             "the model")
        by_name.append((group, [names[id(p)] for p in params]))
    sharding.shard_model(model, device, blocks=blocks, precision=precision,
                         reshard_after_forward=reshard_after_forward)
    now = dict(model.named_parameters())
    if param_groups is None:
        return None
    return [{**group, "params": [now[n] for n in listed]} for group, listed in by_name]
