"""The learner: model, optimizer, schedule, precision and the weighted update (R-DIST-3).

One optimizer update represents `sum_{r,k}(w_rk * l_rk) / sum_{r,k}(w_rk)` over every rank
and micro-batch (R-LOOP-1). How the model is spread over the ranks, and so how the
micro-batches are run and the gradients reduced, is the strategy's (strategies/: DDP or
FSDP); the learner turns the reduced totals into the step, the skip of a zero-weight or
non-finite update, the EMA, the schedule and the update's figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint.initial_weights import load_pending
from embodichain.core.distributed import process_group
from embodichain.core.recipe.schema import OptimizerConfig, SchedulerConfig
from embodichain.core.training.nonfinite import nonfinite_loss
from embodichain.core.training.objective import LossResult, Objective
from embodichain.core.training.param_groups import (
    ParamGroups,
    build_optimizer,
    build_param_groups,
)
from embodichain.core.training.precision import Precision
from embodichain.core.training.strategies import SpreadOptions, Strategy, make_strategy

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


@dataclass(frozen=True)
class UpdateResult:
    """One update's global figures, the same on every rank.

    `metrics`: `loss` and the objective's metrics, weighted means over all ranks and
    micro-batches (empty when the global weight is 0). The rest are the control values that
    rode the update's all-reduce: `stop` is the sum of every rank's stop flag,
    `rank_zero_note` rank 0's note about saves (checkpoint/writer.py), `data_waits` each
    rank's seconds waiting for this update's data (rank r's in slot r).
    """

    metrics: dict[str, float]
    weight: float
    skipped: bool  # the optimizer did not step: zero global weight, or a non-finite loss
    nonfinite: bool
    stop: float
    rank_zero_note: float
    data_waits: tuple[float, ...] = ()
    part_counts: tuple[float, ...] = ()  # a mixture's examples per part, summed over ranks

    @property
    def loss(self) -> float | None:
        return self.metrics.get("loss")


class Learner:
    """Owns the model (spread over the ranks by its strategy), optimizer, LR schedule,
    autocast and grad scaler."""

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
        self.strategy: Strategy = make_strategy(
            strategy, device, precision,
            SpreadOptions(tuple(shard_blocks), reshard_after_forward))
        self.model = model.to(device).train()  # validation switches back after eval()
        param_groups = self.strategy.prepare(self.model, param_groups)
        # train-sl --init-from: each rank its own rows, once the strategy has spread the
        # model (an FSDP rank reads only its shard's) and before the EMA copies it.
        load_pending(self.model)
        self.optimizer = build_optimizer(
            build_param_groups(self.model, optimizer, param_groups), optimizer)
        self.grad_clip = optimizer.grad_clip
        self.base_lr = optimizer.lr
        self._lr_factor = lr_factor(scheduler, optimizer.lr, max_updates)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.ema = (self.strategy.make_ema(self.model, ema_decay) if ema_decay is not None
                    else None)
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
        # What the forward runs through (compiled, DDP); `self.model` (saved, validated,
        # averaged) stays the plain one, sharing its parameters.
        self.wrapped: nn.Module = self.strategy.wrap(self.model, compile=compile)
        self.metric_names: list[str] | None = None
        # One slot per rank for the data waits: a sum all-reduce then carries every rank's
        # own value (its largest is what starves the update), at no collective of its own.
        self._rank, self._waits = process_group.rank(), process_group.world_size()
        # Filled in place every update; on CUDA pinned, so the copy to the device does not
        # wait for the stream (torch.tensor(list) from pageable memory would).
        self._host_flags = torch.zeros(2 + self._waits, dtype=torch.float32,
                                       pin_memory=device.type == "cuda")

    @property
    def lr(self) -> float:
        """The schedule's current learning rate (that of a group with `lr_scale` 1)."""
        return self.base_lr * self._lr_factor(self.scheduler.last_epoch)

    def update(self, objective: Objective, batches: Batch | Sequence[Batch], *,
               stop: float = 0.0, rank_zero_note: float = 0.0,
               data_wait: float | Callable[[], float] = 0.0,
               part_counts: Sequence[float] = ()) -> UpdateResult:
        """One optimizer update over one batch or a sequence of micro-batches.

        `stop` (this rank's stop flag), `rank_zero_note` (rank 0's note to every rank: a
        time-based save is due, a background save failed) and `data_wait` (this rank's
        seconds waiting for the batches; a callable is read once the last micro-batch is
        loaded, so that loads inside the update count) ride the update's all-reduce: the
        first two come back summed over ranks, the waits one per rank; `part_counts` (a
        mixture's examples of each part in this rank's batches, the same length on every
        rank) summed.
        """
        def flags() -> torch.Tensor:
            wait = data_wait() if callable(data_wait) else data_wait
            return self._flags((stop, rank_zero_note), wait, part_counts)

        totals = self.strategy.accumulate(
            self.wrapped, objective, [batches] if isinstance(batches, Mapping) else batches,
            self._local_statistics, flags, self.scaler)
        nonfinite = nonfinite_loss(totals)  # never step on it (trainer.on_nonfinite)
        skipped = totals[0] == 0.0 or nonfinite
        if not skipped:
            # A global batch with no weight does not step: Adam would still move parameters.
            if self.grad_clip is not None:
                self.strategy.clip(self.model, self.optimizer, self.scaler, self.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            if self.ema is not None:
                self.ema.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self._result(totals, skipped, nonfinite, len(part_counts))

    def _local_statistics(self, result: LossResult) -> torch.Tensor:
        """`[w, w * loss, w * metric...]` of one micro-batch."""
        names = sorted(result.metrics)
        if self.metric_names is None:
            self.metric_names = names
        weight = torch.as_tensor(result.weight, dtype=torch.float32, device=self.device)
        values = [weight, result.loss.detach().float() * weight]
        values += [result.metrics[n].detach().float() * weight for n in self.metric_names]
        return torch.stack([v.reshape(()) for v in values])

    def _flags(self, flags: tuple[float, float], data_wait: float,
               part_counts: Sequence[float] = ()) -> torch.Tensor:
        """`[stop, rank_zero_note, wait_0 .. wait_{W-1}, count_0 ..]` (this rank's wait in
        its own slot, its part counts last) as the tensor that rides the update's
        all-reduce."""
        size = 2 + self._waits + len(part_counts)
        if len(self._host_flags) != size:  # a mixture's counts: sized once, on first use
            self._host_flags = torch.zeros(size, dtype=torch.float32,
                                           pin_memory=self._host_flags.is_pinned())
        host = self._host_flags
        host[0], host[1], host[2 + self._rank] = flags[0], flags[1], data_wait
        if part_counts:
            host[2 + self._waits:] = torch.tensor(part_counts, dtype=torch.float32)
        return host.to(self.device, non_blocking=True)

    def _result(self, totals: list[float], skipped: bool, nonfinite: bool,
                parts: int = 0) -> UpdateResult:
        """The totals as weighted means (none when the weight is 0) and control values."""
        totals, counts = (totals[:len(totals) - parts], totals[len(totals) - parts:])
        statistics, (stop, note), waits = (totals[:-2 - self._waits],
                                           totals[-2 - self._waits:-self._waits],
                                           totals[-self._waits:])
        weight = statistics[0]
        metrics: dict[str, float] = {}
        if weight:
            metrics["loss"] = statistics[1] / weight
            for name, value in zip(self.metric_names or [], statistics[2:], strict=True):
                metrics[name] = value / weight
        return UpdateResult(metrics, weight, skipped, nonfinite, float(stop), float(note),
                            tuple(waits), tuple(counts))

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The learner's part of a checkpoint, as its strategy keeps it (DDP: model,
        optimizer, schedule, scaler and EMA; FSDP: schedule and scaler, the rest in each
        rank's shard)."""
        return self.strategy.learner_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.strategy.load_learner_state(self, state)

    def release(self) -> None:
        """Free the strategy's wrappers and groups before the process group is destroyed."""
        self.wrapped = self.model
        self.strategy.release()
