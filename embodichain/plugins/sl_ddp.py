"""The built-in `sl_ddp` recipe: a 4 -> hidden -> 2 MLP on a fixed synthetic regression corpus.

Target 0 = x . [0.5, -1, 0.25, 2] + 0.1 is always supervised; target 1 = x . [1, 0.5, -0.5, 0]
+ sin(2 x_1) only where x_0 > 0. Both carry 0.05 N(0, 1) noise. The objective is the local
masked mean squared error with `weight = mask.sum()`, so ranks whose batches hold different
numbers of supervised targets still combine into the exact global mean (R-DIST-3).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from embodichain.learning.sl import LossResult, SupervisedTrainer, TensorSource
from embodichain.plugins.sl_ddp_schema import DataConfig, ModelConfig, SlDdpConfig

__all__ = ["DataConfig", "ModelConfig", "SlDdpConfig", "build_supervised_trainer",
           "make_corpus", "make_model", "masked_mse", "validation_seed"]

_W0 = (0.5, -1.0, 0.25, 2.0)
_W1 = (1.0, 0.5, -0.5, 0.0)


def validation_seed(seed: int) -> int:
    """The validation corpus's seed: derived from `data.seed`, independent of training."""
    digest = hashlib.sha256(f"sl_ddp-validation:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_corpus(size: int, seed: int) -> dict[str, torch.Tensor]:
    """Inputs `x`, targets `y` and the supervision `mask` (both [size, 2])."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=g)
    noise = 0.05 * torch.randn(size, 2, generator=g)
    y0 = x @ torch.tensor(_W0) + 0.1
    y1 = x @ torch.tensor(_W1) + torch.sin(2.0 * x[:, 1])
    y = torch.stack([y0, y1], dim=1) + noise
    mask = torch.stack([torch.ones(size), (x[:, 0] > 0).float()], dim=1)
    return {"x": x, "y": y, "mask": mask}


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def masked_mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    """Mean squared error over the supervised targets, weighted by their count."""
    squared = (model(batch["x"]) - batch["y"]).square() * batch["mask"]
    weight = batch["mask"].sum()
    return LossResult(loss=squared.sum() / weight.clamp_min(1.0), weight=weight)


def build_supervised_trainer(config: SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    """Factory of the `sl_ddp` recipe (entry point `sl_ddp`)."""
    source = TensorSource(make_corpus(config.data.train_size, config.data.seed)).to(device)
    validation = {k: v.to(device) for k, v in
                  make_corpus(config.data.val_size, validation_seed(config.data.seed)).items()}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        return {"validation/mse": masked_mse(model, validation).loss.item()}

    return SupervisedTrainer(
        config,
        model=make_model(config.model.hidden),
        source=source,
        objective=masked_mse,
        device=device,
        evaluate=evaluate,
    )


build_supervised_trainer.config_schema = SlDdpConfig
