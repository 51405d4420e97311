"""`unknown_seeds:reach`: deploying's reach policy trained on demonstrations whose
environment seeds cannot be told (`UnknownSeeds`, naming the file that would hold them), as
an ALOHA dataset copied without its meta/aloha.json."""

from __future__ import annotations

import deploying  # tests/factories, on the path as this module is
import torch
from torch import nn

from embodichain.learning.sl import LossResult, SupervisedTrainer, TensorSource, UnknownSeeds

MISSING = "/data/reach_demos/meta/seeds.json is missing"


def _objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    loss = (model(batch["x"]) - batch["y"]).square().mean()
    return LossResult(loss=loss, weight=float(len(batch["x"])))


def reach(config, device):
    g = torch.Generator().manual_seed(config.data.seed)
    x = torch.rand(config.data.size, 1, generator=g) * 2 - 1
    source = TensorSource({"x": x, "y": (-x / 0.3).clamp(-1, 1)})
    return SupervisedTrainer(config, model=deploying.ReachModel(), source=source,
                             objective=_objective, device=device, policy=deploying._Acting,
                             demonstration_seeds=UnknownSeeds(MISSING))


reach.config_schema = deploying.reach.config_schema
