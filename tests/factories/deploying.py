"""sl_ddp's recipe with models that declare a deployable forward (training unchanged):

- `deploying:branching`: its deployable forward branches in Python on a tensor's value
  (`.item()`), which `torch.export` cannot capture in a graph: export is refused;
- `deploying:chunked`: an exportable policy, `x [B, 4] -> chunk [B, 3, 2]` (the model's
  output and shifted copies of it), executed by temporal ensembling (m = 0.5);
- `deploying:reach`: closed_loop's recipe (a gymnasium environment in its evaluation
  section) whose linear policy declares a one-action chunk, executed with horizon 1.
"""

from __future__ import annotations

import closed_loop  # tests/factories, on the path as this module is
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


CHUNK = 3


class Chunked(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.model(x)
        return torch.stack([y + 0.25 * i for i in range(CHUNK)], dim=1)


class ChunkedModel(nn.Sequential):
    """sl_ddp's model declaring an exportable chunked deployable forward."""

    def deployable(self) -> nn.Module:
        return Chunked(self)

    def interface(self) -> dict:
        return {"observations": {"x": {"shape": [4], "dtype": "float32", "meaning": "input"}},
                "action": {"key": "y", "shape": [CHUNK, 2], "dtype": "float32",
                           "meaning": "out"},
                "fps": 10, "chunk": CHUNK, "execution": {"temporal_ensemble": 0.5}}


def _trainer(config, device, model_type: type[nn.Sequential]) -> SupervisedTrainer:
    hidden = config.model.hidden
    corpus = sl_ddp.make_corpus(config.data.train_size, config.data.seed)
    return SupervisedTrainer(config, model=model_type(nn.Linear(4, hidden), nn.Tanh(),
                                                      nn.Linear(hidden, 2)),
                             source=TensorSource(corpus), objective=sl_ddp.masked_mse,
                             device=device)


def branching(config, device):
    return _trainer(config, device, GatedModel)


def chunked(config, device):
    return _trainer(config, device, ChunkedModel)


branching.config_schema = sl_ddp.build_supervised_trainer.config_schema
chunked.config_schema = sl_ddp.build_supervised_trainer.config_schema


class ReachModel(nn.Sequential):
    """closed_loop's linear policy (`x [B, 1] -> action [B, 1]`), declaring its deployable
    forward: a chunk of one action, executed with horizon 1."""

    def deployable(self) -> nn.Module:
        return _OneStep(self)

    def interface(self) -> dict:
        return {"observations": {"x": {"shape": [1], "dtype": "float32",
                                       "meaning": "the point's position"}},
                "action": {"key": "move", "shape": [1, 1], "dtype": "float32",
                           "meaning": "move by gain * move"},
                "fps": 10, "chunk": 1, "execution": {"horizon": 1}}


class _OneStep(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).unsqueeze(1)


def reach(config, device):
    """closed_loop's recipe (the Reach environment) with `ReachModel`."""
    trainer = closed_loop.build_supervised_trainer(config, device)
    trainer.learner.model.__class__ = ReachModel  # the same Sequential, its methods added
    return trainer


reach.config_schema = closed_loop.ClosedLoopRecipe
