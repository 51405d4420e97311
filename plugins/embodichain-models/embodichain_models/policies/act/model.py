"""The action-chunking transformer (ACT, Zhao et al. 2023), sized for CPUs.

From the current observation, a transformer encoder reads one token per input (plus the
CVAE's latent token); a decoder with `chunk` learned queries cross-attends to it and
predicts the next `chunk` joint targets. A state policy reads the joint positions and the
objects' poses (privileged state); a camera policy reads the joint positions and its
cameras only (gym-aloha's `pixels_agent_pos`: never object poses), each camera through a
ResNet-18-style backbone (`backbone.py`) whose last feature map is a grid of tokens, as
ACT's. Inputs and actions are normalised by the dataset's mean and std, held as buffers,
and a camera frame is taken as the camera gives it (uint8 `[H, W, 3]`, gym-aloha's 480x640)
and resized in the model (`frames_in`), so the model itself maps raw observations to raw
actions (`deployable()`). It acts, in the closed loop and as the exported artifact, through
a float64 copy (`acting_copy`), so that the checkpoint and its artifact give equal chunks.

Training (`objective`): the L1 error of the normalised chunk over the steps inside the
episode (`action_is_pad` masks the rest), plus, with the CVAE (`cvae: true`), `kl_weight`
times the KL divergence of the latent that a second encoder infers from the demonstrated
chunk (ACT's style variable); at execution the latent is zero, its prior's mean.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from embodichain.learning.sl import LossResult
from embodichain_models.policies.vision.backbone import ResNetEncoder, frames_in, random_shift

STATE, ENV_STATE, ACTION = "observation.state", "observation.environment_state", "action"
IMAGE_PREFIX = "observation.images."


@dataclass(frozen=True)
class ActShape:
    """What the model reads and writes, and its size."""

    state_dim: int
    env_dim: int
    action_dim: int
    chunk: int
    cameras: tuple[str, ...] = ()
    hidden: int = 128
    heads: int = 4
    encoder_layers: int = 2
    decoder_layers: int = 1
    feedforward: int = 512
    dropout: float = 0.1
    cvae: bool = False
    latent_dim: int = 32
    kl_weight: float = 10.0
    channels: int = 32
    fps: int = 50
    execution: dict[str, float] = field(default_factory=lambda: {"temporal_ensemble": 0.01})
    image_sizes: tuple[tuple[int, int], ...] = ()
    """(height, width) the backbone sees of each camera, as `cameras` (the dataset's frames;
    a larger frame is averaged down to it by an integer factor)."""
    frame_size: tuple[int, int] = (480, 640)
    """(height, width) of the frames the deployed policy takes (gym-aloha's cameras')."""
    image_shift: int = 0
    """Random shift augmentation in training (pixels at the backbone's resolution)."""


def _layers(hidden: int, heads: int, ff: int, dropout: float, n: int,
            decoder: bool = False) -> nn.Module:
    kind = nn.TransformerDecoderLayer if decoder else nn.TransformerEncoderLayer
    layer = kind(hidden, heads, ff, dropout, activation="relu", batch_first=True)
    stack = nn.TransformerDecoder if decoder else nn.TransformerEncoder
    kwargs = {} if decoder else {"enable_nested_tensor": False}
    return stack(layer, n, **kwargs)


class ActPolicy(nn.Module):
    """`policy(observations, actions=None, is_pad=None) -> (chunk, mu, logvar)`: the
    normalised chunk `[B, chunk, action_dim]`; `mu`/`logvar` of the CVAE latent when
    `actions` (normalised) are given and the CVAE is on, else None."""

    def __init__(self, shape: ActShape, stats: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.shape = s = shape
        h = s.hidden
        for key, name, floor in ((STATE, "state", 1e-2), (ENV_STATE, "env", 1e-2),
                                 (ACTION, "action", 1e-3)):
            if key == ENV_STATE and not s.env_dim:
                continue
            mean = torch.as_tensor(stats[key]["mean"], dtype=torch.float32).reshape(-1)
            std = torch.as_tensor(stats[key]["std"], dtype=torch.float32).reshape(-1)
            self.register_buffer(f"{name}_mean", mean)
            self.register_buffer(f"{name}_std", std.clamp_min(floor))
        self.state_in = nn.Linear(s.state_dim, h)
        if s.env_dim:  # a camera policy never sees the objects' poses
            self.env_in = nn.Linear(s.env_dim, h)
        sizes = dict(zip(s.cameras, s.image_sizes, strict=True))
        self.cameras = nn.ModuleDict({c: ResNetEncoder(s.channels, h, sizes[c])
                                      for c in s.cameras})
        cells = sum(encoder.cells for encoder in self.cameras.values())
        self.encoder_pos = nn.Parameter(torch.zeros(1, 2 + bool(s.env_dim) + cells, h))
        self.latent_in = nn.Linear(s.latent_dim, h)
        self.encoder = _layers(h, s.heads, s.feedforward, s.dropout, s.encoder_layers)
        self.queries = nn.Parameter(torch.zeros(1, s.chunk, h))
        self.decoder = _layers(h, s.heads, s.feedforward, s.dropout, s.decoder_layers, True)
        self.head = nn.Linear(h, s.action_dim)
        if s.cvae:  # the style encoder: [cls, state, actions...] -> latent mean, log-variance
            self.style_cls = nn.Parameter(torch.zeros(1, 1, h))
            self.style_state = nn.Linear(s.state_dim, h)
            self.style_action = nn.Linear(s.action_dim, h)
            self.style_pos = nn.Parameter(torch.zeros(1, 2 + s.chunk, h))
            self.style = _layers(h, s.heads, s.feedforward, s.dropout, s.encoder_layers)
            self.style_out = nn.Linear(h, 2 * s.latent_dim)
        for p in (self.encoder_pos, self.queries, *([self.style_pos] if s.cvae else [])):
            nn.init.normal_(p, std=0.02)

    def normalised(self, observations: dict[str, torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
        dtype = self.state_mean.dtype  # float32, or float64 when acting (`acting_copy`)
        state = (observations[STATE].to(dtype) - self.state_mean) / self.state_std
        if not self.shape.env_dim:
            return state, None
        env = (observations[ENV_STATE].to(dtype) - self.env_mean) / self.env_std
        return state, env

    def image(self, camera: str, frames: torch.Tensor) -> torch.Tensor:
        """A camera's frames (uint8 `[B, H, W, 3]` as the camera gives them, or float
        `[B, 3, h, w]` in [0, 1] as the dataset decodes them) at the backbone's size, in
        [0, 1], shifted at random in training."""
        size = self.cameras[camera].size
        images = frames_in(frames, size)
        if self.training and self.shape.image_shift:
            images = random_shift(images, self.shape.image_shift)
        return images

    def forward(self, observations: dict[str, torch.Tensor], actions: torch.Tensor | None = None,
                is_pad: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        s = self.shape
        state, env = self.normalised(observations)
        batch = state.shape[0]
        mu = logvar = None
        if s.cvae and actions is not None:
            tokens = torch.cat([self.style_cls.expand(batch, -1, -1),
                                self.style_state(state).unsqueeze(1),
                                self.style_action(actions)], 1) + self.style_pos
            pad = torch.zeros(batch, 2, dtype=torch.bool, device=state.device)
            mask = torch.cat([pad, is_pad], 1) if is_pad is not None else None
            mu, logvar = self.style_out(self.style(tokens, src_key_padding_mask=mask)[:, 0]
                                        ).chunk(2, -1)
            latent = mu + torch.exp(0.5 * logvar) * torch.randn_like(mu)
        else:
            latent = state.new_zeros(batch, s.latent_dim)
        tokens = [self.latent_in(latent).unsqueeze(1), self.state_in(state).unsqueeze(1)]
        if env is not None:
            tokens.append(self.env_in(env).unsqueeze(1))
        # The backbones compute in float32 also in the float64 acting copy (onnxruntime's
        # CPU convolutions are float32 only).
        tokens += [self.cameras[c](self.image(c, observations[IMAGE_PREFIX + c])
                                   ).to(state.dtype) for c in s.cameras]
        memory = self.encoder(torch.cat(tokens, 1) + self.encoder_pos)
        out = self.decoder(self.queries.expand(batch, -1, -1), memory)
        return self.head(out), mu, logvar

    @torch.no_grad()
    def act_chunk(self, observations: dict[str, torch.Tensor]) -> torch.Tensor:
        """The raw action chunk `[B, chunk, action_dim]` for raw observations, float32
        (computed in this module's dtype: float64 for the acting copy)."""
        return (self(observations)[0] * self.action_std + self.action_mean).float()

    def acting_copy(self) -> ActPolicy:
        """The copy that acts, in the closed loop and in the exported artifact: float64,
        its layer norms' epsilon the float32 that ONNX's attribute holds. Two engines
        (torch here, onnxruntime on a robot) computing in float32 differ in the last bits
        of most chunk entries, and a closed loop's contacts grow that into another
        trajectory; this computation differs by ~1e-15 between them, which the float32
        chunk absorbs (docs/deploy.md, "Parity"). The camera backbones stay float32
        (onnxruntime's CPU convolutions are float32 only)."""
        # Rebuilt from the full weights rather than deep-copied: under FSDP this module's
        # parameters are shards (full_tensor() gathers them; every rank calls it).
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v
                 for k, v in self.state_dict().items()}
        stats = {key: {"mean": state[f"{name}_mean"], "std": state[f"{name}_std"]}
                 for key, name in ((STATE, "state"), (ENV_STATE, "env"), (ACTION, "action"))
                 if f"{name}_mean" in state}
        with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten
            acting = ActPolicy(self.shape, stats)
        acting.load_state_dict(state)
        acting = acting.to(self.state_mean.device).double().eval()
        acting.cameras.float()
        for module in acting.modules():
            if isinstance(module, nn.LayerNorm):
                module.eps = float(np.float32(module.eps))
        return acting

    def observation_keys(self) -> list[str]:
        return [STATE, *([ENV_STATE] if self.shape.env_dim else []),
                *(IMAGE_PREFIX + c for c in self.shape.cameras)]

    def deployable(self) -> nn.Module:
        """A module mapping raw float32 observation tensors (positional, in the order of
        `interface()["observations"]`) to the raw action chunk, normalisation baked in."""
        return DeployableAct(self.acting_copy())

    def interface(self) -> dict[str, Any]:
        """What the deployable forward reads and writes, and how its chunks are executed."""
        s = self.shape
        # `source`: where gym-aloha's `pixels_agent_pos` gives it, so `eval ARTIFACT` acts in
        # the camera recipe's environment as the checkpoint's policy does (execution.py).
        observations = {
            STATE: {"shape": [s.state_dim], "dtype": "float32", "source": ["agent_pos"],
                    "meaning": "joint positions (6 per arm, radians) and grippers (0 closed, "
                               "1 open), left arm first (gym-aloha's agent_pos)"}}
        if s.env_dim:
            observations[ENV_STATE] = {
                "shape": [s.env_dim], "dtype": "float32",
                "meaning": "object poses: xyz (m) and quaternion wxyz per object"}
        for c in s.cameras:
            observations[IMAGE_PREFIX + c] = {
                "shape": [*s.frame_size, 3], "dtype": "uint8", "source": ["pixels", c],
                "meaning": f"camera {c!r}, RGB as the camera gives it (gym-aloha's "
                           f"pixels[{c!r}]); resized and normalised inside"}
        return {"observations": observations,
                "action": {"key": ACTION, "shape": [s.chunk, s.action_dim],
                           "meaning": "joint targets, as observation.state"},
                "fps": s.fps, "chunk": s.chunk, "execution": dict(s.execution)}


class DeployableAct(nn.Module):
    """`forward(state[, env_state][, frames...]) -> chunk`: the policy for export (a
    camera's uint8 frame resized and normalised inside)."""

    def __init__(self, policy: ActPolicy) -> None:
        super().__init__()
        self.policy = policy
        self.keys = policy.observation_keys()

    def forward(self, *observations: torch.Tensor) -> torch.Tensor:
        named = dict(zip(self.keys, observations, strict=True))
        return self.policy.act_chunk(named)


def masked_l1(pred: torch.Tensor, target: torch.Tensor, is_pad: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean absolute error over the real steps of each chunk, and their number."""
    real = (~is_pad).to(pred.dtype).unsqueeze(-1)
    weight = real.sum()
    l1 = ((pred - target).abs() * real).sum() / (weight * pred.shape[-1]).clamp_min(1.0)
    return l1, weight


def normalised_actions(model: ActPolicy, actions: torch.Tensor) -> torch.Tensor:
    return (actions.float() - model.action_mean) / model.action_std


def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    """Masked L1 of the normalised chunk (+ kl_weight x KL with the CVAE): steps past the
    episode's end (`action_is_pad`) neither count nor weigh, so ranks combine exactly."""
    core: ActPolicy = getattr(model, "module", model)
    target = normalised_actions(core, batch[ACTION])
    is_pad = batch["action_is_pad"]
    pred, mu, logvar = model(batch, target, is_pad)
    l1, weight = masked_l1(pred, target, is_pad)
    metrics = {"l1": l1.detach()}
    loss = l1
    if mu is not None and logvar is not None:
        kl = (-0.5 * (1 + logvar - mu.square() - logvar.exp()).sum(-1)).mean()
        loss = loss + core.shape.kl_weight * kl
        metrics["kl"] = kl.detach()
    return LossResult(loss=loss, weight=weight, metrics=metrics)
