"""Factory of the cart-pole-from-pixels recipe: a small CNN estimates `[x, θ, ẋ, θ̇]` from a
short stack of rendered frames, read lazily from HDF5 through a `DatasetSource`.

The network regresses the normalised `[x, sin θ, cos θ, ẋ, θ̇]` (statistics of the training
split, kept as buffers of the model). Validation on rank 0 reports `validation/mse` in state
units (the mean over the four state variables, θ's error wrapped into [−π, π)) beside
`validation/baseline_mse`, that of always predicting the training split's mean state.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from embodichain.learning.sl import DatasetSource, LossResult, SupervisedTrainer, file_digest
from embodichain_models.perception.cartpole_pixels.dataset import PixelFrames, state_features
from embodichain_models.perception.cartpole_pixels.schema import PixelsConfig

STATE_NAMES = ("x", "theta", "x_dot", "theta_dot")


class StateFromPixels(nn.Module):
    """Three strided convolutions and two linear layers; outputs normalised features."""

    def __init__(self, in_channels: int, size: int, channels: int, hidden: int,
                 mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * math.ceil(size / 8) ** 2, hidden), nn.ReLU(),
            nn.Linear(hidden, 5))
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.net(frames)

    def state(self, frames: torch.Tensor) -> torch.Tensor:
        """Estimated `[x, θ, ẋ, θ̇]` in state units."""
        f = self(frames) * self.std + self.mean
        theta = torch.atan2(f[:, 1], f[:, 2])
        return torch.stack((f[:, 0], theta, f[:, 3], f[:, 4]), dim=-1)


def state_errors(estimate: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Squared errors `[N, 4]` in state units, θ's wrapped into [−π, π)."""
    error = estimate - state
    error[:, 1] = torch.remainder(error[:, 1] + math.pi, 2 * math.pi) - math.pi
    return error.square()


def build_supervised_trainer(config: PixelsConfig, device: torch.device) -> SupervisedTrainer:
    """Factory of the `cartpole_pixels` recipe (entry point `cartpole_pixels`)."""
    data = config.data
    train = PixelFrames(data.train, data.stack, data.shift)
    features = state_features(train.states.reshape(-1, 4))
    mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
    model = StateFromPixels(3 * data.stack, train.size, config.model.channels,
                            config.model.hidden, mean, std)
    identity = f"train {file_digest(data.train)}, val {file_digest(data.val)}"
    source = DatasetSource(train, identity=identity)
    validation: dict[str, torch.Tensor] = {}

    def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
        target = (state_features(batch["state"]) - mean.to(device)) / std.to(device)
        loss = (model(batch["frames"]) - target).square().mean()
        return LossResult(loss=loss, weight=torch.tensor(float(len(target)), device=device))

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        if not validation:  # read once, on rank 0, without augmentation
            val = PixelFrames(data.val, data.stack, shift=0)
            count = min(len(val), config.validation.max_examples or len(val))
            examples = [val[i] for i in range(count)]
            validation["frames"] = torch.stack([e["frames"] for e in examples])
            validation["state"] = torch.stack([e["state"] for e in examples])
        errors = []
        for start in range(0, len(validation["state"]), 256):
            frames = validation["frames"][start:start + 256].to(device)
            state = validation["state"][start:start + 256].to(device)
            errors.append(state_errors(model.state(frames), state))
        per_dim = torch.cat(errors).mean(0)
        baseline = _mean_state(train.states.reshape(-1, 4)).to(device)
        base = state_errors(baseline.expand_as(validation["state"]).clone().to(device),
                            validation["state"].to(device)).mean(0)
        metrics = {"validation/mse": per_dim.mean().item(),
                   "validation/baseline_mse": base.mean().item()}
        metrics.update({f"validation/mse_{n}": v.item()
                        for n, v in zip(STATE_NAMES, per_dim, strict=True)})
        return metrics

    return SupervisedTrainer(config, model=model, source=source, objective=objective,
                             device=device, evaluate=evaluate)


def _mean_state(states: torch.Tensor) -> torch.Tensor:
    """The training split's mean state (θ: the circular mean)."""
    theta = torch.atan2(torch.sin(states[:, 1]).mean(), torch.cos(states[:, 1]).mean())
    return torch.stack((states[:, 0].mean(), theta, states[:, 2].mean(), states[:, 3].mean()))


build_supervised_trainer.config_schema = PixelsConfig
