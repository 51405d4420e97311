"""Diffusion Policy's CNN variant (Chi et al. 2023; lerobot's `DiffusionPolicy`), sized for
CPUs.

The observation of the last `n_obs_steps` frames conditions a 1-D U-Net (`unet.py`) by FiLM:
per frame the joint positions (min-max normalised to [-1, 1]) and, per camera, the image
through ACT's backbone (`policies/vision/backbone.py`, a ResNet-18 layout with GroupNorm) whose
1x1 projection gives `keypoints` maps, a spatial softmax their expected (x, y) and a linear
layer the frame's feature (lerobot's `DiffusionRgbEncoder`); all frames' features are
concatenated. Training (`objective`): the horizon of normalised actions gets DDPM noise at a
random level and the U-Net predicts that noise (mean squared error). Acting (`act_chunk`):
from a given standard-normal horizon, `sampling_steps` DDIM steps (`noise.py`) give the
horizon of raw actions. The noise is an argument, so the exported artifact (noise an input of
its graph, the DDIM loop unrolled in it) gives the checkpoint's actions for the same noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from embodichain.core.deploy.runner import NOISE_RULE
from embodichain.learning.sl import LossResult
from embodichain_models.policies.act.model import ACTION, ENV_STATE, IMAGE_PREFIX, STATE
from embodichain_models.policies.diffusion.noise import NoiseSchedule
from embodichain_models.policies.diffusion.unet import ConditionalUnet1d
from embodichain_models.policies.vision.backbone import (
    ResNetEncoder,
    feature_grid,
    frames_in,
    random_shift,
)

NOISE = "noise"
"""The artifact's input holding the sampler's starting noise."""
RANGE_FLOOR = 1e-2  # a feature that barely moves is not blown up by min-max normalisation


@dataclass(frozen=True)
class DiffusionShape:
    """What the policy reads and writes, and its size (`schema.ModelSection`'s fields)."""

    state_dim: int
    env_dim: int
    action_dim: int
    cameras: tuple[str, ...] = ()
    image_sizes: tuple[tuple[int, int], ...] = ()
    frame_size: tuple[int, int] = (480, 640)
    fps: int = 50
    horizon: int = 16
    n_obs_steps: int = 2
    n_action_steps: int = 8
    down_dims: tuple[int, ...] = (64, 128, 256)
    kernel_size: int = 5
    groups: int = 8
    step_embedding: int = 64
    film_scale: bool = True
    channels: int = 32
    keypoints: int = 32
    image_features: int = 64
    image_shift: int = 0
    train_timesteps: int = 100
    sampling_steps: int = 10
    clip_sample: float | None = 1.0
    prediction: str = "epsilon"  # or "sample": what the U-Net predicts (schema.ModelSection)
    state_noise: float = 0.0  # training noise on the normalised joints (schema.ModelSection)
    image_pooling: str = "keypoints"  # or "flatten" (schema.ModelSection)
    state_dropout: float = 0.0  # training examples whose joints are withheld (schema.ModelSection)
    temporal_ensemble: float | None = None  # acting: a horizon every step, ensembled (schema)


class CameraEncoder(nn.Module):
    """A camera's images `[N, 3, h, w]` in [0, 1] to features `[N, features]`: ACT's backbone
    projected to `keypoints` maps, pooled, a linear layer and ReLU. Pooled by `keypoints`:
    each map's spatial-softmax (x, y) (lerobot's `DiffusionRgbEncoder`); by `flatten`: every
    cell of every map, which keeps what a cell holds and not only where a map peaks."""

    def __init__(self, channels: int, keypoints: int, features: int,
                 size: tuple[int, int], pooling: str = "keypoints") -> None:
        super().__init__()
        self.backbone = ResNetEncoder(channels, keypoints, size)
        self.pooling = pooling
        rows, cols = feature_grid(size)
        if pooling == "keypoints":  # the cells' (x, y), for each map's expected position
            y, x = torch.meshgrid(torch.linspace(-1, 1, rows), torch.linspace(-1, 1, cols),
                                  indexing="ij")
            self.register_buffer("grid", torch.stack([x.reshape(-1), y.reshape(-1)], -1),
                                 persistent=False)
        self.out = nn.Linear(keypoints * (2 if pooling == "keypoints" else rows * cols),
                             features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        maps = self.backbone(images).transpose(1, 2)  # [N, keypoints, cells]
        if self.pooling == "keypoints":
            maps = maps.softmax(-1) @ self.grid  # the expected (x, y) of each map
        return F.relu(self.out(maps.flatten(1)))


class DiffusionPolicy(nn.Module):
    """`policy(observations, noisy, t) -> predicted noise` (see the module); observations
    hold `[B, n_obs_steps, ...]` histories, actions are `[B, horizon, action_dim]`."""

    def __init__(self, shape: DiffusionShape, stats: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.shape = s = shape
        for key, name in ((STATE, "state"), (ENV_STATE, "env"), (ACTION, "action")):
            if key == ENV_STATE and not s.env_dim:
                continue
            low = torch.as_tensor(stats[key]["min"], dtype=torch.float32).reshape(-1)
            high = torch.as_tensor(stats[key]["max"], dtype=torch.float32).reshape(-1)
            self.register_buffer(f"{name}_min", low)
            self.register_buffer(f"{name}_range", (high - low).clamp_min(RANGE_FLOOR))
        sizes = dict(zip(s.cameras, s.image_sizes, strict=True))
        self.cameras = nn.ModuleDict({c: CameraEncoder(s.channels, s.keypoints,
                                                       s.image_features, sizes[c],
                                                       s.image_pooling)
                                      for c in s.cameras})
        per_frame = (s.state_dim + (1 if s.state_dropout else 0) + s.env_dim
                     + s.image_features * len(s.cameras))
        self.unet = ConditionalUnet1d(s.action_dim, per_frame * s.n_obs_steps, s.down_dims,
                                      s.kernel_size, s.groups, s.step_embedding, s.film_scale)
        self.schedule = NoiseSchedule(s.train_timesteps, s.clip_sample)

    def _normalised(self, x: torch.Tensor, name: str) -> torch.Tensor:
        low, span = getattr(self, f"{name}_min"), getattr(self, f"{name}_range")
        return (x.float() - low) / span * 2 - 1

    def normalised_actions(self, actions: torch.Tensor) -> torch.Tensor:
        return self._normalised(actions, "action")

    def condition(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        """`[B, n_obs_steps * per-frame features]`: each frame's joints (and object poses
        for a state policy) and camera features."""
        s = self.shape
        state = self._normalised(observations[STATE], "state")
        if self.training and s.state_noise:  # torch's generator, restored on resume
            state = state + torch.randn_like(state) * s.state_noise
        parts = [state]
        if s.state_dropout:  # a flag per frame: are the joints there (always, when acting)
            present = state.new_ones(*state.shape[:2], 1)
            if self.training:  # per example, torch's generator, restored on resume
                present = (torch.rand(state.shape[0], 1, 1, device=state.device)
                           >= s.state_dropout).to(state.dtype).expand_as(present)
            parts = [state * present, present]
        if s.env_dim:
            parts.append(self._normalised(observations[ENV_STATE], "env"))
        for camera, encoder in self.cameras.items():
            frames = observations[IMAGE_PREFIX + camera]  # [B, n, ...]
            batch, steps = frames.shape[:2]
            images = frames_in(frames.flatten(0, 1), encoder.backbone.size)
            if self.training and s.image_shift:
                images = random_shift(images, s.image_shift)
            parts.append(encoder(images).reshape(batch, steps, -1))
        return torch.cat(parts, -1).flatten(1)

    def forward(self, observations: dict[str, torch.Tensor], noisy: torch.Tensor,
                t: torch.Tensor) -> torch.Tensor:
        return self.unet(noisy, t, self.condition(observations))

    def target(self, actions: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """What the U-Net learns to predict of the noised normalised `actions`: the `noise`
        (epsilon prediction) or the actions themselves (sample prediction)."""
        return actions if self.shape.prediction == "sample" else noise

    @torch.no_grad()
    def act_chunk(self, observations: dict[str, torch.Tensor], noise: torch.Tensor
                  ) -> torch.Tensor:
        """The raw action horizon `[B, horizon, action_dim]` (float32) that DDIM denoises
        from `noise` (standard normal, that shape) for the observations' histories."""
        s = self.shape
        condition = self.condition(observations)
        x = noise.float()
        for t in self.schedule.ddim_timesteps(s.sampling_steps):
            level = x.new_full((x.shape[0],), float(t))
            predicted = self.unet(x, level, condition)
            eps = (self.schedule.epsilon_of(predicted, t, x) if s.prediction == "sample"
                   else predicted)
            x = self.schedule.ddim_step(eps, t, x, s.sampling_steps)
        return (x + 1) / 2 * self.action_range + self.action_min

    def acting_copy(self) -> DiffusionPolicy:
        """A copy in eval mode with the full weights (under FSDP this module's parameters
        are shards: full_tensor() gathers them; every rank calls it)."""
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v
                 for k, v in self.state_dict().items()}
        stats = {key: {"min": state[f"{name}_min"],
                       "max": state[f"{name}_min"] + state[f"{name}_range"]}
                 for key, name in ((STATE, "state"), (ENV_STATE, "env"), (ACTION, "action"))
                 if f"{name}_min" in state}
        with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten
            acting = DiffusionPolicy(self.shape, stats)
        acting.load_state_dict(state)
        return acting.to(self.action_min.device).eval()

    def observation_keys(self) -> list[str]:
        return [STATE, *([ENV_STATE] if self.shape.env_dim else []),
                *(IMAGE_PREFIX + c for c in self.shape.cameras)]

    def deployable(self) -> nn.Module:
        """`forward(*observation histories, noise) -> raw action horizon` for export."""
        return DeployableDiffusion(self.acting_copy())

    def interface(self) -> dict[str, Any]:
        """The artifact's inputs (each observation stacked over `n_obs_steps`; the sampler's
        noise, declared with the rule by which the runner draws it), its output, and how
        horizons are executed."""
        s = self.shape
        n = s.n_obs_steps
        observations: dict[str, Any] = {STATE: {
            "shape": [s.state_dim], "dtype": "float32", "stack": n, "source": ["agent_pos"],
            "meaning": "joint positions (6 per arm, radians) and grippers (0 closed, 1 open), "
                       "left arm first (gym-aloha's agent_pos)"}}
        if s.env_dim:
            observations[ENV_STATE] = {"shape": [s.env_dim], "dtype": "float32", "stack": n,
                                       "meaning": "object poses: xyz (m), quaternion wxyz"}
        for c in s.cameras:
            observations[IMAGE_PREFIX + c] = {
                "shape": [*s.frame_size, 3], "dtype": "uint8", "stack": n,
                "source": ["pixels", c],
                "meaning": f"camera {c!r}, RGB as the camera gives it (gym-aloha's "
                           f"pixels[{c!r}]); resized and normalised inside"}
        every = ("step" if s.temporal_ensemble is not None
                 else f"{s.n_action_steps} steps")
        noise = {"key": NOISE, "shape": [s.horizon, s.action_dim], "dtype": "float32",
                 **NOISE_RULE,
                 "meaning": "standard normal noise the sampler denoises into the horizon, a "
                            f"new one for each horizon (every {every}), "
                            "drawn by the runner from the episode's seed"}
        return {"observations": observations, "noise": noise,
                "action": {"key": ACTION, "shape": [s.horizon, s.action_dim],
                           "meaning": "joint targets, as observation.state"},
                "fps": s.fps, "chunk": s.horizon,
                "execution": execution_of(s)}


def execution_of(shape: DiffusionShape) -> dict[str, float | int]:
    """How sampled horizons become actions, as the artifact runner names it."""
    if shape.temporal_ensemble is not None:
        return {"temporal_ensemble": shape.temporal_ensemble}
    return {"horizon": shape.n_action_steps}


class DeployableDiffusion(nn.Module):
    """`forward(state[, env_state][, frames...], noise) -> horizon`: the policy for export,
    its DDIM loop unrolled in the graph."""

    def __init__(self, policy: DiffusionPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.keys = policy.observation_keys()

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        *observations, noise = inputs
        return self.policy.act_chunk(dict(zip(self.keys, observations, strict=True)), noise)


def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    """DDPM: the mean squared error of the predicted noise (or, with `prediction: sample`,
    of the predicted clean horizon), at a level drawn per example
    (torch's generator, restored on resume); every step of the horizon counts (past the
    episode's end the dataset repeats the last action, as lerobot's default)."""
    core: DiffusionPolicy = getattr(model, "module", model)
    actions = core.normalised_actions(batch[ACTION])
    noise = torch.randn_like(actions)
    t = torch.randint(0, core.shape.train_timesteps, (actions.shape[0],),
                      device=actions.device)
    predicted = model(batch, core.schedule.add_noise(actions, noise, t), t)
    loss = F.mse_loss(predicted, core.target(actions, noise))
    return LossResult(loss=loss, weight=float(actions.shape[0]),
                      metrics={"mse": loss.detach()})
