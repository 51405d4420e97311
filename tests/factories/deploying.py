"""sl_ddp's recipe with models that declare a deployable forward (training unchanged):

- `deploying:branching`: its deployable forward branches in Python on a tensor's value
  (`.item()`), which `torch.export` cannot capture in a graph: export is refused;
- `deploying:chunked`: an exportable policy, `x [B, 4] -> chunk [B, 3, 2]` (the model's
  output and shifted copies of it), executed by temporal ensembling (m = 0.5);
- `deploying:drifting`: `chunked`'s policy whose traced graph computes something else than
  its eager forward (the chunk scaled by 1.01 while `torch.export` traces): the export's
  check against the model must refuse it;
- `deploying:reach`: a linear policy judged in closed_loop's Reach environment (its
  evaluation section), declaring a one-action chunk executed with horizon 1;
- `deploying:short`: `chunked`'s forward (3 actions) declaring a chunk of 4.
"""

from __future__ import annotations

import closed_loop  # tests/factories, on the path as this module is
import torch
from torch import nn

from embodichain.learning.sl import LossResult, SupervisedTrainer, TensorSource
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


class ShortChunkModel(ChunkedModel):
    """Declares a chunk of 4 where its deployable forward gives 3 actions."""

    def interface(self) -> dict:
        declared = super().interface()
        declared["action"]["shape"], declared["chunk"] = [CHUNK + 1, 2], CHUNK + 1
        return declared


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


def short(config, device):
    return _trainer(config, device, ShortChunkModel)


branching.config_schema = sl_ddp.build_supervised_trainer.config_schema
chunked.config_schema = sl_ddp.build_supervised_trainer.config_schema
short.config_schema = sl_ddp.build_supervised_trainer.config_schema


class Drifting(Chunked):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y * 1.01 if torch.compiler.is_exporting() else y  # same shape, other values


class DriftingModel(ChunkedModel):
    """`ChunkedModel` whose exported graph is not its eager forward."""

    def deployable(self) -> nn.Module:
        return Drifting(self)


def drifting(config, device):
    return _trainer(config, device, DriftingModel)


drifting.config_schema = sl_ddp.build_supervised_trainer.config_schema


class ReachModel(nn.Module):
    """A linear policy for closed_loop's Reach (`x [B, 1] -> action [B, 1]`), declaring
    its deployable forward: a chunk of one action, executed with horizon 1."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

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


class _Acting:
    """The checkpoint's closed-loop policy: `act(obs [N, 1]) -> model(obs)`."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device

    def reset(self, env_index: int) -> None:
        pass

    def act(self, observations: object) -> torch.Tensor:
        return self.model(torch.as_tensor(observations, device=self.device))


def reach(config, device):
    """A linear policy trained to output -x / 0.3 (clipped), judged in closed_loop's Reach
    (the recipe's `evaluation.env.constructor: closed_loop:make_reach`)."""
    g = torch.Generator().manual_seed(config.data.seed)
    x = torch.rand(config.data.size, 1, generator=g) * 2 - 1
    source = TensorSource({"x": x, "y": (-x / 0.3).clamp(-1, 1)})

    def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
        loss = (model(batch["x"]) - batch["y"]).square().mean()
        return LossResult(loss=loss, weight=float(len(batch["x"])))

    return SupervisedTrainer(config, model=ReachModel(), source=source, objective=objective,
                             device=device, policy=_Acting)


reach.config_schema = closed_loop.ClosedLoopRecipe
