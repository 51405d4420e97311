"""The objective contract: a local loss and its weight (R-DIST-3)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn


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
