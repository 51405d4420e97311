"""The optimizer step, the grad scaler's update and the EMA, skipped when the update says so
(R-GPU-1).

An update whose global weight is 0 or whose global loss is not finite is not applied, and
under fp16 neither is one whose gradients overflowed (GradScaler's `found_inf`). Those
decisions are tensors on the training device. Where the device is the host (CPU), reading
them waits for nothing: the step is simply not taken (`HostDecidedStep`). On a GPU, reading
them makes the host wait for the device every update, so the skip is applied there without
a read, in one of two ways:

- `FoundInfStep`: optimizers that take torch's `found_inf` (fused Adam, AdamW and SGD: the
  flag GradScaler hands them) get the decision as their `found_inf`; their kernel leaves the
  parameters and the state untouched and takes the step count back. No copy.
- `CopiedStep` (`trainer.skip_guard: copy`, the others): the step always runs, with torch's
  own arithmetic, and what it must not change is put back: the parameters, which the next
  forward reads at once, kept before the step and selected back on the device
  (`torch.where`); the optimizer state (moments, step counts), which nothing reads before the
  next step, kept and restored once the host has read the decision. Cost: one copy of the
  parameters and the optimizer state per update, and the memory to hold it.
  `trainer.skip_guard: sync` reads the decision on the host instead (`HostDecidedStep`): no
  copy, one wait for the device per update.

Common to all: state a skipped first step created is removed once the host knows; the
grad scaler's scale and growth tracker (two numbers, read by the next backward) are kept and
selected back; the EMA's average, which nothing reads before the parameters next change, is
taken once the host knows (`settle`), from the same parameters, and its buffer copies (which
the next forward may change in the model) are taken at once and put back on a skip.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
from torch import nn

from embodichain.core.distributed.sharding import local

SkipGuard = Literal["copy", "sync"]
# Devices whose tensors the host reads without waiting: the skip is decided there.
HOST_DEVICES = ("cpu",)


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


def takes_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer's step reads `found_inf` (torch's fused Adam, AdamW, SGD: the
    mark GradScaler looks for)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class GuardedStep:
    """The learner's step, applied unless the update says to skip it."""

    @staticmethod
    def choose(parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, ema: Any, device: torch.device,
               skip_guard: SkipGuard | str = "copy") -> GuardedStep:
        """The guard for this device and optimizer (see the module's docstring)."""
        if device.type in HOST_DEVICES or skip_guard == "sync":
            return HostDecidedStep(parameters, optimizer, scaler, ema)
        if takes_found_inf(optimizer):
            return FoundInfStep(parameters, optimizer, scaler, ema)
        return CopiedStep(parameters, optimizer, scaler, ema)

    def __init__(self, parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, ema: Any) -> None:
        self.parameters = list(parameters)
        self.optimizer = optimizer
        self.scaler = scaler
        self.ema = ema
        self._scale, self._ema_buffers = _Kept(), _Kept()
        self._fresh: list[Any] = []  # parameters whose optimizer state the step created
        self._values: dict[Any, dict[str, Any]] = {}  # non-tensor state entries

    def step(self, skip: torch.Tensor, clip: Callable[[], None] | None) -> torch.Tensor:
        """Unscale (fp16), clip, step, update the scale and the EMA. `skip` (a 0-d bool on
        the device): the learner's skip. Returns whether the optimizer's step was skipped
        (`skip`, or fp16 gradients that overflowed), for `settle`."""
        found_inf = self._unscale()
        if clip is not None:
            clip()
        no_step = skip if found_inf is None else skip | (found_inf > 0)
        self._step(skip, no_step)
        if self.scaler.is_enabled():
            # torch's own update (backoff on found_inf, growth), not applied on a skip, as
            # before: the learner's skip never reached the scaler.
            self._scale.keep([self.scaler._scale, self.scaler._growth_tracker])
            self.scaler.update()
            self._scale.select_back(skip)
        if self.ema is not None:
            self._ema_buffers.keep(self.ema.buffer_tensors())
            self.ema.copy_buffers()
        return no_step

    def _step(self, skip: torch.Tensor, no_step: torch.Tensor) -> None:
        """The optimizer's step, without a trace where `no_step` holds."""
        raise NotImplementedError

    def _note_fresh_state(self) -> None:
        """What `settle` puts back of a skipped step's state that is not a tensor, and the
        state a first step creates."""
        state = self.optimizer.state
        self._fresh = [p for p in self.parameters if p not in state]
        self._values = {p: {k: v for k, v in state[p].items() if not torch.is_tensor(v)}
                        for p in self.parameters if p in state}

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
        put back (state its first step created removed); the EMA averaged, or its buffer
        copies put back."""
        if not stepped:
            self._restore_state()
            state = self.optimizer.state
            for p, values in self._values.items():
                state[p].update(values)
            for p in self._fresh:
                state.pop(p, None)
        if self.ema is not None:
            if skipped:
                self._ema_buffers.restore()
            else:
                self.ema.average()
        self._fresh, self._values = [], {}

    def _restore_state(self) -> None:
        """A skipped step's tensors of optimizer state, as they were before it."""


class HostDecidedStep(GuardedStep):
    """The decision read on the host before the step: free where the device is the host
    (CPU); elsewhere one wait for the device per update (`trainer.skip_guard: sync`). No
    copy: a skipped step is simply not taken."""

    def step(self, skip: torch.Tensor, clip: Callable[[], None] | None) -> torch.Tensor:
        found_inf = self._unscale()
        if clip is not None:
            clip()
        no_step = skip if found_inf is None else skip | (found_inf > 0)
        skipped, not_stepped = torch.stack([skip, no_step]).tolist()  # the one host read
        if not not_stepped:
            self.optimizer.step()
        if self.scaler.is_enabled():
            self._scale.keep([self.scaler._scale, self.scaler._growth_tracker])
            self.scaler.update()
            self._scale.select_back(skip)
        if self.ema is not None and not skipped:
            self.ema.update()
        return no_step

    def settle(self, skipped: bool, stepped: bool) -> None:
        """Nothing to put back: the step decided at once."""


class FoundInfStep(GuardedStep):
    """The decision handed to a fused optimizer as its `found_inf` (as GradScaler does):
    its kernel skips on the device. No copy."""

    def _step(self, skip: torch.Tensor, no_step: torch.Tensor) -> None:
        self._note_fresh_state()
        # The gradients are unscaled already (`_unscale`): no grad_scale, as GradScaler's
        # step passes after an `unscale_`.
        self.optimizer.found_inf = no_step.to(torch.float32)  # type: ignore[attr-defined]
        self.optimizer.grad_scale = None  # type: ignore[attr-defined]
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf, self.optimizer.grad_scale  # type: ignore[attr-defined]


class CopiedStep(GuardedStep):
    """The step always taken; the parameters selected back on the device where skipped,
    the optimizer state restored at `settle` (`trainer.skip_guard: copy`). One copy of
    both per update."""

    def __init__(self, parameters: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, ema: Any) -> None:
        super().__init__(parameters, optimizer, scaler, ema)
        self._params, self._state = _Kept(), _Kept()

    def _step(self, skip: torch.Tensor, no_step: torch.Tensor) -> None:
        self._note_fresh_state()
        state = self.optimizer.state
        self._state.keep(v for p in self.parameters for v in state.get(p, {}).values()
                         if torch.is_tensor(v))
        self._params.keep(self.parameters)
        self.optimizer.step()
        self._params.select_back(no_step)

    def _restore_state(self) -> None:
        self._state.restore()
