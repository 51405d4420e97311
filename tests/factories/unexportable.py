"""The sl_ddp factory whose model's deployable forward cannot be exported
(`unexportable:build`): it branches in Python on a tensor's value (`.item()`), which
`torch.export` cannot capture in a graph. Training is the sl_ddp recipe's, unchanged."""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


class Branching(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.model(x)
        if y.sum().item() > 0:  # data-dependent control flow: not exportable
            y = -y
        return y.unsqueeze(1)


class GatedModel(nn.Sequential):
    """sl_ddp's model (the same state_dict) declaring a branching deployable forward."""

    def deployable(self) -> nn.Module:
        return Branching(self)

    def interface(self) -> dict:
        return {"observations": {"x": {"shape": [4], "dtype": "float32", "meaning": "input"}},
                "action": {"key": "y", "shape": [1, 2], "dtype": "float32", "meaning": "out"},
                "fps": 10, "chunk": 1, "execution": {"horizon": 1}}


def build(config, device):
    """sl_ddp's recipe with `GatedModel` as its model."""
    hidden = config.model.hidden
    corpus = sl_ddp.make_corpus(config.data.train_size, config.data.seed)
    return SupervisedTrainer(config, model=GatedModel(nn.Linear(4, hidden), nn.Tanh(),
                                                      nn.Linear(hidden, 2)),
                             source=TensorSource(corpus), objective=sl_ddp.masked_mse,
                             device=device)


build.config_schema = sl_ddp.build_supervised_trainer.config_schema
