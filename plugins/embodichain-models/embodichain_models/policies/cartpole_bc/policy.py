"""The behaviour-cloning policy: a small CNN over the last camera frames plus the state,
predicting a chunk of future cart forces (normalised by the dataset's statistics)."""

from __future__ import annotations

import math

import torch
from torch import nn

from embodichain.learning.sl import LossResult
from embodichain_models.envs.cartpole.task import FPS, MAX_FORCE, TASK


def state_features(state: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`[x, sin θ, cos θ, ẋ, θ̇]` with x and the velocities divided by `scale` `[3]`: the
    angle as sine and cosine, so the hanging pole (θ = ±π) is one place, not two."""
    x, theta, x_dot, theta_dot = state.unbind(-1)
    return torch.stack((x / scale[0], torch.sin(theta), torch.cos(theta), x_dot / scale[1],
                        theta_dot / scale[2]), dim=-1)


class ChunkPolicy(nn.Module):
    """`policy(images [B, F, 3, S, S], state [B, 4]) -> normalised forces [B, chunk]`."""

    def __init__(self, frames: int, size: int, chunk: int, channels: int, hidden: int,
                 state_scale: torch.Tensor, action_mean: torch.Tensor,
                 action_std: torch.Tensor, execute: int = 1) -> None:
        super().__init__()
        self.frames, self.size, self.chunk, self.execute = frames, size, chunk, execute
        self.encoder = nn.Sequential(
            nn.Conv2d(3 * frames, channels, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(channels, channels, 3, stride=2, padding=1), nn.ReLU(),
            nn.Flatten(), nn.Linear(channels * math.ceil(size / 8) ** 2, hidden), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(hidden + 5, hidden), nn.ReLU(),
                                  nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, chunk))
        self.register_buffer("state_scale", state_scale.to(torch.float32))
        self.register_buffer("action_mean", action_mean.to(torch.float32).reshape(()))
        self.register_buffer("action_std", action_std.to(torch.float32).reshape(()))

    def forward(self, images: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        pixels = self.encoder(images.flatten(1, 2))
        return self.head(torch.cat((pixels, state_features(state, self.state_scale)), -1))

    def forces(self, images: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The chunk of forces in newtons `[B, chunk]`."""
        return self(images, state) * self.action_std + self.action_mean

    def deployable(self) -> nn.Module:
        """What is deployed: the camera's last frames (uint8, as the camera gives them) and
        the state -> forces in newtons `[B, chunk, 1]`."""
        return DeployedChunkPolicy(self)

    def interface(self) -> dict:
        """The deployable forward's observations (the simulated cart-pole's, `image` and
        `state`), action and chunk execution."""
        return {
            "kind": "policy",
            "observations": {
                "image": {"shape": [3, self.size, self.size], "dtype": "uint8",
                          "stack": self.frames, "meaning":
                          "the camera frame (RGB, channels first, 0..255); the policy sees "
                          f"the last {self.frames}, oldest first (at an episode's start the "
                          "first repeated)"},
                "state": {"shape": [4], "dtype": "float32", "meaning":
                          "[x (m), theta (rad, 0 upright), x_dot (m/s), theta_dot (rad/s)]"}},
            "action": {"key": "action", "shape": [self.chunk, 1], "dtype": "float32",
                       "meaning": f"cart forces (N) for the next {self.chunk} control steps; "
                                  f"clip to +-{MAX_FORCE:g} N"},
            "fps": FPS, "chunk": self.chunk, "execution": {"horizon": self.execute},
            "task": TASK}


class DeployedChunkPolicy(nn.Module):
    """`(frames uint8 [B, F, 3, S, S], state [B, 4]) -> forces [B, chunk, 1]` (N): the
    policy's deployable forward, the pixels' scaling and the normalisation inside."""

    def __init__(self, policy: ChunkPolicy) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, frames: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        images = frames.float().div(255.0)  # as the closed loop (ChunkExecution) scales them
        return self.policy.forces(images, state).unsqueeze(-1)


def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    """Mean squared error of the normalised chunk over the steps inside the episode: the
    steps past its end (`action_is_pad`) neither count nor weigh, so ranks combine into
    the exact mean over real steps."""
    pred = model(batch["observation.image"], batch["observation.state"])
    real = (~batch["action_is_pad"]).to(pred.dtype)
    weight = real.sum()
    loss = ((pred - batch["action"]).square() * real).sum() / weight.clamp_min(1.0)
    return LossResult(loss=loss, weight=weight,
                      metrics={"padded_fraction": 1.0 - weight / real.numel()})


class ChunkExecution:
    """The closed-loop side of the policy (embodichain's `ClosedLoopPolicy`): per
    environment slot, the last `frames` camera frames (the first repeated at an episode's
    start, as the dataset pads) and the chunk being executed; a new chunk every `execute`
    steps, its forces applied one per step. One batched forward per step for every slot."""

    def __init__(self, model: ChunkPolicy, device: torch.device, frames: int, execute: int
                 ) -> None:
        self.model, self.device, self.frames, self.execute = model, device, frames, execute
        self.history: dict[int, list[torch.Tensor]] = {}
        self.plan: dict[int, torch.Tensor] = {}
        self.steps: dict[int, int] = {}

    def reset(self, env_index: int) -> None:
        self.history.pop(env_index, None)
        self.steps[env_index] = 0

    def act(self, observations: dict) -> torch.Tensor:
        """`{"image": uint8 [N, 3, S, S], "state": float32 [N, 4]}` -> forces `[N, 1]` (N)."""
        images = torch.from_numpy(observations["image"]).float().div_(255.0)
        state = torch.from_numpy(observations["state"])
        for i, image in enumerate(images):
            self.history[i] = (self.history.get(i) or [image] * self.frames)[1:] + [image]
        stacked = torch.stack([torch.stack(self.history[i], 0) for i in range(len(images))])
        forces = self.model.forces(stacked.to(self.device), state.to(self.device)).cpu()
        chosen = []
        for i in range(len(images)):
            t = self.steps.get(i, 0)
            if t % self.execute == 0 or i not in self.plan:
                self.plan[i] = forces[i]
            chosen.append(self.plan[i][t % self.execute])
            self.steps[i] = t + 1
        return torch.stack(chosen).unsqueeze(1)
