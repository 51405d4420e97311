"""Exponential moving average of the model's weights (R-LOOP-2, `trainer.ema`).

After every optimizer step: `ema = decay * ema + (1 - decay) * param` for each parameter, in
one fused `torch._foreach_lerp_` (no Python loop over parameters), and the buffers are
copied. Parameters are identical on every rank, so the average is too. Its state is a
plain model state dict, saved as the learner's `ema` entry: `payload["learner"]["ema"]` of a
checkpoint loads into the model with `model.load_state_dict(...)`.

Whatever computes with the EMA's weights (validation, the closed loop's policy) gets them
as `with ema.acting() as model:`, a module of the model's own class (its methods, not only
`forward`, are there: a policy calls `act_chunk`), under every strategy (R-EVAL-5).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn


class Ema:
    """The averaged copy of a model (same class, kept in eval mode, without gradients)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self._averaged = [p for p in self.model.parameters()]
        self._sources = [p for p in model.parameters()]
        self._buffers = [b for b in self.model.buffers()]
        self._source_buffers = [b for b in model.buffers()]

    def update(self) -> None:
        """Move the average towards the model's current parameters; copy the buffers."""
        self.average()
        self.copy_buffers()

    @torch.no_grad()
    def average(self) -> None:
        """The parameters' half of `update` (the learner may run it later, before the
        parameters next change: guarded_step.py)."""
        torch._foreach_lerp_(self._averaged, self._sources, 1.0 - self.decay)

    @torch.no_grad()
    def copy_buffers(self) -> None:
        """The buffers' half of `update` (a forward may change the model's own)."""
        if self._buffers:
            torch._foreach_copy_(self._buffers, self._source_buffers)

    @contextlib.contextmanager
    def acting(self) -> Iterator[nn.Module]:
        """The averaged copy itself (a module of the model's class)."""
        yield self.model

    def buffer_tensors(self) -> list[torch.Tensor]:
        """What `copy_buffers` changes (kept by the learner, to undo a skipped update's)."""
        return list(self._buffers)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state)


def ema_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """The EMA's validation figures under `validation_ema/...` (with `validate: both`)."""
    return {(f"validation_ema/{k.removeprefix('validation/')}" if k.startswith("validation/")
             else f"ema/{k}"): v for k, v in metrics.items()}


Weights = Callable[[], AbstractContextManager[nn.Module]]
"""`with weights() as model:` a module of the model's class holding the weights to judge."""


def validation_models(model: nn.Module, ema: Any, mode: str | None
                      ) -> list[tuple[Weights, Callable[[Mapping[str, float]],
                                                        Mapping[str, float]]]]:
    """What validation evaluates (the model's weights, the EMA's: an `Ema` or a
    `ShardedEma`), each with how its figures are named."""
    own: Weights = functools.partial(contextlib.nullcontext, model)
    if ema is None or mode == "model":
        return [(own, dict)]
    if mode == "ema":
        return [(ema.acting, dict)]
    return [(own, dict), (ema.acting, ema_metrics)]
