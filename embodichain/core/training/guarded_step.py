"""The optimizer step, the grad scaler's update and the EMA, skipped on the device (R-GPU-1).

An update whose global weight is 0 or whose global loss is not finite is not applied, and
under fp16 neither is one whose gradients overflowed (GradScaler's `found_inf`). Those
decisions are device tensors: reading them on the host would make the host wait for the
device every update. So the step always runs, with torch's own optimizer arithmetic (the
same kernels as an unguarded step: training stays bitwise what it was), and what it must not
change is put back, the way GradScaler and the fused optimizers skip with `found_inf`:

- the parameters, which the next forward reads at once: kept before the step and selected
  back on the device (`torch.where`) when the step is skipped;
- the grad scaler's scale and growth tracker (read by the next backward): the same;
- the optimizer's state (moments, step counts, state a first step creates) and the EMA,
  which nothing reads before the next step: kept, and restored by `settle(...)` once the host
  has read the update's decisions (one update later, or at a log, save or validation).

Cost: one copy of the parameters and of the optimizer state per update (and of the EMA),
and the memory to hold them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from embodichain.core.distributed.sharding import local


class _Kept:
    """Copies of a list of tensors, in buffers reused from one update to the next."""

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}
        self.live: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []

    def keep(self, tensors: Iterable[torch.Tensor]) -> None:
        live = [local(t).detach() for t in tensors]
        buffers: dict[int, torch.Tensor] = {}
        for t in live:
            b = self._buffers.get(id(t))
            if b is None or b.shape != t.shape or b.dtype != t.dtype or b.device != t.device:
                b = torch.empty_like(t)
            buffers[id(t)] = b
        self._buffers, self.live = buffers, live
        self.kept = [buffers[id(t)] for t in live]
        _copy(self.kept, self.live)

    def select_back(self, condition: torch.Tensor) -> None:
        """On the device: each tensor back to its kept copy where `condition` holds."""
        for live, kept in zip(self.live, self.kept, strict=True):
            torch.where(condition, kept, live, out=live)

    def restore(self) -> None:
        _copy(self.live, self.kept)


def _copy(destinations: Sequence[torch.Tensor], sources: Sequence[torch.Tensor]) -> None:
    """`destinations[i].copy_(sources[i])`, fused per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], tuple[list, list]] = {}
    for d, s in zip(destinations, sources, strict=True):
        group = groups.setdefault((d.device, d.dtype), ([], []))
        group[0].append(d)
        group[1].append(s)
    for dst, src in groups.values():
        torch._foreach_copy_(dst, src)


class GuardedStep:
    """The learner's step, applied unless the device says to skip it."""

    def __init__(self, parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, ema: Any) -> None:
        self.parameters = list(parameters)
        self.optimizer = optimizer
        self.scaler = scaler
        self.ema = ema
        self._params, self._state, self._scale, self._ema = _Kept(), _Kept(), _Kept(), _Kept()
        self._fresh: list[Any] = []  # parameters whose optimizer state the step created
        self._values: dict[Any, dict[str, Any]] = {}  # non-tensor state entries

    def step(self, skip: torch.Tensor, clip: Callable[[], None] | None) -> torch.Tensor:
        """Unscale (fp16), clip, step, update the scale and the EMA; what a skipped update
        changed of the parameters and the scale is put back at once. `skip` (a 0-d bool on
        the device): the learner's skip. Returns whether the optimizer's step was skipped
        (`skip`, or fp16 gradients that overflowed), for `settle`."""
        found_inf = self._unscale()
        if clip is not None:
            clip()
        no_step = skip if found_inf is None else skip | (found_inf > 0)
        state = self.optimizer.state
        self._fresh = [p for p in self.parameters if p not in state]
        self._values = {p: {k: v for k, v in state[p].items() if not torch.is_tensor(v)}
                        for p in self.parameters if p in state}
        self._state.keep(v for p in self.parameters for v in state.get(p, {}).values()
                         if torch.is_tensor(v))
        self._params.keep(self.parameters)
        self.optimizer.step()
        self._params.select_back(no_step)
        if self.scaler.is_enabled():
            # torch's own update (backoff on found_inf, growth), not applied on a skip, as
            # before: the learner's skip never reached the scaler.
            self._scale.keep([self.scaler._scale, self.scaler._growth_tracker])
            self.scaler.update()
            self._scale.select_back(skip)
        if self.ema is not None:
            self._ema.keep(self.ema.tensors())
            self.ema.update()
        return no_step

    def _unscale(self) -> torch.Tensor | None:
        """fp16: the gradients unscaled, and whether any was not finite (GradScaler's
        `found_inf`, as its `step` reads it); None without a scaler."""
        if not self.scaler.is_enabled():
            return None
        self.scaler.unscale_(self.optimizer)
        found = self.scaler._per_optimizer_states[id(self.optimizer)]["found_inf_per_device"]
        values = list(found.values())
        return values[0] if len(values) == 1 else torch.stack(
            [v.to(values[0].device, non_blocking=True) for v in values]).sum()

    def settle(self, skipped: bool, stepped: bool) -> None:
        """Once the host knows the update's decisions: a skipped step's optimizer state
        restored (state its first step created removed), a skipped update's EMA."""
        if not stepped:
            state = self.optimizer.state
            self._state.restore()
            for p, values in self._values.items():
                state[p].update(values)
            for p in self._fresh:
                state.pop(p, None)
        if skipped and self.ema is not None:
            self._ema.restore()
        self._fresh, self._values = [], {}
