"""The learner: model, optimizer, schedule, precision and the weighted update (R-DIST-3).

One optimizer update represents `sum_{r,k}(w_rk * l_rk) / sum_{r,k}(w_rk)` over every rank
and micro-batch (R-LOOP-1). How the model is spread over the ranks, and so how the
micro-batches are run and the gradients reduced, is the strategy's (strategies/: DDP or
FSDP); the learner turns the reduced totals into the step, the skip of a zero-weight or
non-finite update, the EMA, the schedule and the update's figures. None of it waits for the
device (R-GPU-1): on a GPU the skip is applied there (guarded_step.py; on the CPU the host
reads it, which waits for nothing) and the figures reach the host through pinned buffers
(host_copies.py), read during the next update (`settle`).
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
from embodichain.core.training.activation_checkpointing import apply_activation_checkpointing
from embodichain.core.training.guarded_step import GuardedStep
from embodichain.core.training.host_copies import HostCopies, Slot
from embodichain.core.training.memory import peak_bytes
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
class _Figures:
    metrics: dict[str, float]
    weight: float
    skipped: bool
    nonfinite: bool
    stop: float
    rank_zero_note: float
    data_waits: tuple[float, ...]
    part_counts: tuple[float, ...]
    memory_peaks: tuple[float, ...] = ()


class UpdateResult:
    """One update's global figures, the same on every rank.

    `metrics`: `loss` and the objective's metrics, weighted means over all ranks and
    micro-batches (empty when the global weight is 0). The rest are the control values that
    rode the update's all-reduce: `stop` is the sum of every rank's stop flag,
    `rank_zero_note` rank 0's note about saves (checkpoint/writer.py), `data_waits` each
    rank's seconds waiting for this update's data (rank r's in slot r), `part_counts` a
    mixture's examples per part, summed over ranks. `skipped`: the optimizer did not step
    (zero global weight, or a non-finite loss).

    The figures stay on the device until asked for (R-GPU-1): the learner reads them during
    the next update, once they have reached the host; asking earlier (`settle()`, or any
    figure) waits for this update to finish on the device.
    """

    def __init__(self, settle: Callable[[], None]) -> None:
        self._settle = settle
        self._figures: _Figures | None = None

    @property
    def settled(self) -> bool:
        """Whether the figures are on the host (reading them waits for nothing)."""
        return self._figures is not None

    def settle(self) -> UpdateResult:
        if self._figures is None:
            self._settle()
        assert self._figures is not None
        return self

    def _get(self) -> _Figures:
        return self.settle()._figures  # type: ignore[return-value]

    metrics = property(lambda self: self._get().metrics)
    weight = property(lambda self: self._get().weight)
    skipped = property(lambda self: self._get().skipped)
    nonfinite = property(lambda self: self._get().nonfinite)
    stop = property(lambda self: self._get().stop)
    rank_zero_note = property(lambda self: self._get().rank_zero_note)
    data_waits = property(lambda self: self._get().data_waits)
    part_counts = property(lambda self: self._get().part_counts)
    memory_peaks = property(lambda self: self._get().memory_peaks)  # bytes, rank r's in r

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
        skip_guard: str = "copy",
        strategy: str = "ddp",
        shard_blocks: Sequence[nn.Module] = (),
        reshard_after_forward: bool = True,
        activation_checkpointing: Sequence[str] = (),
    ) -> None:
        if precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"precision must be fp32, bf16 or fp16, got {precision!r}")
        self.device = device
        self.precision = precision
        self.strategy: Strategy = make_strategy(
            strategy, device, precision,
            SpreadOptions(tuple(shard_blocks), reshard_after_forward))
        self.model = model.to(device).train()  # validation switches back after eval()
        # Before DDP or FSDP wraps it; the parameters' names stay (trainer.activation_checkpointing)
        self.checkpointed = apply_activation_checkpointing(self.model, activation_checkpointing)
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
        # Flags out and figures back through pinned buffers, without waiting (R-GPU-1); the
        # step applied unless the update says to skip it (`skip_guard`: how, on a GPU, for
        # an optimizer without `found_inf`).
        self._copies = HostCopies(device)
        self._guard = GuardedStep.choose(list(self.model.parameters()), self.optimizer,
                                         self.scaler, self.ema, device, skip_guard)
        self._pending: tuple[UpdateResult, Slot, int] | None = None

    @property
    def lr(self) -> float:
        """The schedule's current learning rate (that of a group with `lr_scale` 1)."""
        return self.base_lr * self._lr_factor(self.scheduler.last_epoch)

    def update(self, objective: Objective, batches: Batch | Sequence[Batch], *,
               stop: float = 0.0, rank_zero_note: float = 0.0,
               data_wait: float | Callable[[], float] = 0.0,
               part_counts: Sequence[float] = (),
               backward_done: Callable[[], None] | None = None) -> UpdateResult:
        """One optimizer update over one batch or a sequence of micro-batches.

        `stop` (this rank's stop flag), `rank_zero_note` (rank 0's note to every rank: a
        time-based save is due, a background save failed) and `data_wait` (this rank's
        seconds waiting for the batches; a callable is read once the last micro-batch is
        loaded, so that loads inside the update count) ride the update's all-reduce: the
        first two come back summed over ranks, the waits one per rank; `part_counts` (a
        mixture's examples of each part in this rank's batches, the same length on every
        rank) summed; each rank's peak memory rides along too (R-OPS-3). `backward_done` is
        called once the last backward is queued (the time split, R-OPS-2). The result's
        figures are read when first asked for, or by the next update (`settle`); until then
        the optimizer state and EMA may hold what a skipped update puts back at its settle.
        """
        slot = self._copies.next_slot(2 + 2 * self._waits + len(part_counts))

        def flags() -> torch.Tensor:
            wait = data_wait() if callable(data_wait) else data_wait
            return self._flags(slot, (stop, rank_zero_note), wait, part_counts)

        totals = self.strategy.accumulate(
            self.wrapped, objective, [batches] if isinstance(batches, Mapping) else batches,
            self._local_statistics, flags, self.scaler)
        if backward_done is not None:
            backward_done()
        # On the device: a global batch with no weight does not step (Adam would still move
        # the parameters), nor one whose loss is not finite (trainer.on_nonfinite).
        weight, weighted_loss = totals[0], totals[1]
        nonfinite = (weight != 0) & ~(torch.isfinite(weight) & torch.isfinite(weighted_loss))
        skip = (weight == 0) | nonfinite
        # The previous update's figures have reached the host by now (this update's forward
        # and backward are queued behind it): its skipped step's state is put back before
        # this step reads it.
        self.settle()
        clip = (None if self.grad_clip is None else
                lambda: self.strategy.clip(self.model, self.grad_clip))
        no_step = self._guard.step(skip, clip)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        slot.send_back(torch.cat([totals.float(),
                                  torch.stack([skip, nonfinite, no_step]).float()]))
        result = UpdateResult(self.settle)
        self._pending = (result, slot, len(part_counts))
        return result

    def settle(self) -> None:
        """Read the last update's figures (waiting for its copy, if it has not arrived) and
        finish its skip: what it must not have changed of the optimizer state and the EMA
        is put back. Before anything reads that state (a save, validation)."""
        if self._pending is None:
            return
        result, slot, parts = self._pending
        self._pending = None
        values = slot.read()
        totals, (skip, nonfinite, no_step) = values[:-3], values[-3:]
        self._guard.settle(skipped=bool(skip), stepped=not no_step)
        result._figures = self._result(totals, bool(skip), bool(nonfinite), parts)

    def _local_statistics(self, result: LossResult) -> torch.Tensor:
        """`[w, w * loss, w * metric...]` of one micro-batch."""
        names = sorted(result.metrics)
        if self.metric_names is None:
            self.metric_names = names
        weight = (torch.as_tensor(result.weight, dtype=torch.float32, device=self.device)
                  if torch.is_tensor(result.weight) else  # a number: filled on the device,
                  torch.full((), float(result.weight), dtype=torch.float32,  # no copy
                             device=self.device))
        values = [weight, result.loss.detach().float() * weight]
        values += [result.metrics[n].detach().float() * weight for n in self.metric_names]
        return torch.stack([v.reshape(()) for v in values])

    def _flags(self, slot: Slot, flags: tuple[float, float], data_wait: float,
               part_counts: Sequence[float] = ()) -> torch.Tensor:
        """`[stop, rank_zero_note, wait_0 .. wait_{W-1}, peak_0 .. peak_{W-1}, count_0 ..]`
        (this rank's wait and peak memory in its own slots, its part counts last) as the
        tensor that rides the update's all-reduce."""
        host = slot.flags
        host[0], host[1], host[2 + self._rank] = flags[0], flags[1], data_wait
        host[2 + self._waits + self._rank] = peak_bytes(self.device)  # a host counter
        if part_counts:
            host[2 + 2 * self._waits:] = torch.tensor(part_counts, dtype=torch.float32)
        return slot.to_device()

    def _result(self, totals: list[float], skipped: bool, nonfinite: bool,
                parts: int = 0) -> _Figures:
        """The totals as weighted means (none when the weight is 0) and control values."""
        totals, counts = (totals[:len(totals) - parts], totals[len(totals) - parts:])
        totals, peaks = totals[:-self._waits], totals[-self._waits:]
        statistics, (stop, note), waits = (totals[:-2 - self._waits],
                                           totals[-2 - self._waits:-self._waits],
                                           totals[-self._waits:])
        weight = statistics[0]
        metrics: dict[str, float] = {}
        if weight:
            metrics["loss"] = statistics[1] / weight
            for name, value in zip(self.metric_names or [], statistics[2:], strict=True):
                metrics[name] = value / weight
        return _Figures(metrics, weight, skipped, nonfinite, float(stop), float(note),
                        tuple(waits), tuple(counts), tuple(peaks))

    # -- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The learner's part of a checkpoint, as its strategy keeps it (DDP: model,
        optimizer, schedule, scaler and EMA; FSDP: schedule and scaler, the rest in each
        rank's shard)."""
        self.settle()
        return self.strategy.learner_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.settle()
        self.strategy.load_learner_state(self, state)

    def release(self) -> None:
        """Free the strategy's wrappers and groups before the process group is destroyed."""
        self.wrapped = self.model
        self.strategy.release()
