"""The objective contract: a local loss and its weight (R-DIST-3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from embodichain.core.errors import TrainingError


@dataclass
class LossResult:
    """What an objective returns for one local batch.

    `loss` is the local loss (e.g. a masked mean) and `weight` what it averages over (e.g.
    `mask.sum()`). An update then represents `sum_r(weight_r * loss_r) / sum_r(weight_r)`
    over all ranks, exactly. `metrics` are scalar tensors, averaged across ranks with the
    same weights and logged under `train/`.
    """

    loss: torch.Tensor
    weight: torch.Tensor | float
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


Objective = Callable[[nn.Module, dict[str, torch.Tensor]], LossResult]


def check_loss_result(result: object, objective: object) -> LossResult:
    """`result` if it is a LossResult whose loss is a tensor; else a TrainingError saying what
    the objective must return (not an AttributeError deep in the update)."""
    name = getattr(objective, "__qualname__", None) or type(objective).__name__
    must = ("it must return LossResult(loss=..., weight=...) (from embodichain.learning.sl): "
            "the local loss as a tensor and its weight, e.g. weight=mask.sum()")
    if not isinstance(result, LossResult):
        kind = ("a bare tensor" if isinstance(result, torch.Tensor)
                else type(result).__name__)
        raise TrainingError(f"the objective {name} returned {kind}; {must}")
    if not isinstance(result.loss, torch.Tensor):
        raise TrainingError(f"the objective {name} returned a LossResult whose loss is "
                            f"{type(result.loss).__name__}, not a tensor; {must}")
    return result
