"""A third-party-style classification recipe: 3 classes, cross-entropy, accuracy.

Written as the README's "Writing a factory" section shows; named in recipes as
`classifying:build_supervised_trainer` with tests/factories on PYTHONPATH. Validation
reports `validation/accuracy` (higher is better) and `validation/loss`, and the factory makes
accuracy its best metric (`SupervisedTrainer(best=...)`); `data.val_size: 0` gives a trainer
without `evaluate`. The objective also reports `train/accuracy`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from embodichain.learning.sl import LossResult, Section, SupervisedTrainer, TensorSource


class Model(Section):
    hidden: int = 16


class Data(Section):
    train_size: int = 2048
    val_size: int = 512
    seed: int = 7
    spread: float = 1.0
    """Standard deviation of each class's blob around its centre (overlap: < 100% accuracy)."""


class ClassifyingRecipe(Section):
    model: Model = Model()
    data: Data = Data()


def corpus(size: int, seed: int, spread: float) -> dict[str, torch.Tensor]:
    """Three Gaussian blobs on the unit circle, 120 degrees apart."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (size,), generator=g)
    angle = y.float() * (2 * math.pi / 3)
    centre = torch.stack([angle.cos(), angle.sin()], dim=1)
    return {"x": centre + spread * torch.randn(size, 2, generator=g), "y": y}


def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    logits = model(batch["x"])
    accuracy = (logits.argmax(dim=1) == batch["y"]).float().mean()
    return LossResult(loss=nn.functional.cross_entropy(logits, batch["y"]),
                      weight=float(len(batch["y"])), metrics={"accuracy": accuracy})


def build_supervised_trainer(config: ClassifyingRecipe, device: torch.device
                             ) -> SupervisedTrainer:
    source = TensorSource(corpus(config.data.train_size, config.data.seed, config.data.spread))
    evaluate = None
    if config.data.val_size:
        val = corpus(config.data.val_size, config.data.seed + 1, config.data.spread)

        def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
            logits = model(val["x"].to(device))
            target = val["y"].to(device)
            return {"validation/accuracy": (logits.argmax(1) == target).float().mean().item(),
                    "validation/loss": nn.functional.cross_entropy(logits, target).item()}

    model = nn.Sequential(nn.Linear(2, config.model.hidden), nn.Tanh(),
                          nn.Linear(config.model.hidden, 3))
    return SupervisedTrainer(config, model=model, source=source, objective=objective,
                             device=device, evaluate=evaluate,
                             best=("validation/accuracy", "max"))


build_supervised_trainer.config_schema = ClassifyingRecipe
