"""The NeRD dynamics model: a small nanoGPT-style transformer over (state, action) tokens.

Each token is the normalised `[state, action]` of one frame; the output at position t is the
normalised state change Δ_t = s_{t+1} − s_t (θ difference wrapped). Normalisation statistics
are buffers, so they travel with the model's state dict and every checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from embodichain_models.dynamics.nerd.physics import THETA, wrap_angle

STATE_DIM = 4
ACTION_DIM = 2


@dataclass(frozen=True)
class NerdModelConfig:
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    window: int = 10
    causal: bool = True
    dropout: float = 0.0
    norm_eps: float = 1e-5


def state_delta(states: torch.Tensor) -> torch.Tensor:
    """Δ between consecutive states along dim −2, with the θ difference wrapped to [−π, π)."""
    delta = states[..., 1:, :] - states[..., :-1, :]
    theta = wrap_angle(delta[..., THETA])
    return torch.cat((delta[..., :THETA], theta.unsqueeze(-1), delta[..., THETA + 1:]), dim=-1)


def apply_delta(state: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """Next state = state + Δ, with θ wrapped back into [−π, π)."""
    nxt = state + delta
    theta = wrap_angle(nxt[..., THETA])
    return torch.cat((nxt[..., :THETA], theta.unsqueeze(-1), nxt[..., THETA + 1:]), dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, cfg: NerdModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.causal = cfg.causal
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: NerdModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = SelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class NerdTransformer(nn.Module):
    """Predicts normalised Δstate for every position of a `[B, T ≤ window]` history."""

    def __init__(self, cfg: NerdModelConfig, seed: int = 0) -> None:
        super().__init__()
        if cfg.d_model % cfg.heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by heads {cfg.heads}")
        self.cfg = cfg
        self.embed = nn.Linear(STATE_DIM + ACTION_DIM, cfg.d_model, bias=False)
        self.pos = nn.Parameter(torch.zeros(cfg.window, cfg.d_model))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.head = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_model, bias=False),
            nn.GELU(),
            nn.Linear(cfg.d_model, STATE_DIM, bias=False),
        )
        # Identity statistics until `set_normalization` is called with the training split's.
        self.register_buffer("input_mean", torch.zeros(STATE_DIM + ACTION_DIM))
        self.register_buffer("input_var", torch.ones(STATE_DIM + ACTION_DIM))
        self.register_buffer("target_mean", torch.zeros(STATE_DIM))
        self.register_buffer("target_var", torch.ones(STATE_DIM))
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        """nanoGPT initialisation from a private generator: the same seed gives the same
        weights whatever the global RNG state, on every rank."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")):
                    param.fill_(1.0)
                    continue
                # Projections that write into the residual stream get a smaller init (GPT-2).
                std = residual_std if name.endswith(("attn.proj.weight", "mlp.2.weight")) else 0.02
                param.copy_(torch.randn(param.shape, generator=gen) * std)

    @torch.no_grad()
    def set_normalization(self, input_mean: torch.Tensor, input_var: torch.Tensor,
                          target_mean: torch.Tensor, target_var: torch.Tensor) -> None:
        for name, value in (("input_mean", input_mean), ("input_var", input_var),
                            ("target_mean", target_mean), ("target_var", target_var)):
            buf = getattr(self, name)
            buf.copy_(value.to(buf))

    def _scale(self, var: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(var + self.cfg.norm_eps)

    def normalize_target(self, delta: torch.Tensor) -> torch.Tensor:
        return (delta - self.target_mean) / self._scale(self.target_var)

    def denormalize_target(self, delta: torch.Tensor) -> torch.Tensor:
        return delta * self._scale(self.target_var) + self.target_mean

    def forward(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Normalised Δstate predictions `[B, T, 4]` from raw `states [B, T, 4]` and
        `actions [B, T, 2]`; position t sees positions ≤ t only when `causal`."""
        t = states.shape[-2]
        if t > self.cfg.window:
            raise ValueError(f"history of {t} steps is longer than the window {self.cfg.window}")
        tokens = torch.cat((states, actions), dim=-1)
        tokens = (tokens - self.input_mean) / self._scale(self.input_var)
        x = self.drop(self.embed(tokens) + self.pos[:t])
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def predict_next(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Next raw state `[B, 4]` after the last step of the given history."""
        delta = self.denormalize_target(self(states, actions)[:, -1].float())
        return apply_delta(states[:, -1], delta)

    def deployable(self) -> nn.Module:
        """What is deployed: a learned simulator step, `(states [B, window, 4], actions
        [B, window, 2]) -> next state [B, 4]` in raw units (normalisation inside)."""
        return NerdStep(self)

    def interface(self) -> dict:
        """The simulator step's inputs (a full history window) and output."""
        w = self.cfg.window
        return {
            "kind": "simulator_step",
            "observations": {
                "states": {"shape": [w, STATE_DIM], "dtype": "float32", "meaning":
                           f"the last {w} states [x (m), theta (rad, 0 upright), x_dot (m/s), "
                           "theta_dot (rad/s)], oldest first"},
                "actions": {"shape": [w, ACTION_DIM], "dtype": "float32", "meaning":
                            f"the actions [cart force (N), pole torque (N m)] applied at those "
                            f"{w} states"}},
            "action": {"key": "next_state", "shape": [STATE_DIM], "dtype": "float32",
                       "meaning": "the state one frame after the last one (theta wrapped "
                                  "into [-pi, pi))"}}


class NerdStep(nn.Module):
    """The NeRD model as a learned simulator step (its deployable forward)."""

    def __init__(self, model: NerdTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, states: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        delta = self.model.denormalize_target(self.model(states, actions)[:, -1].float())
        return apply_delta(states[:, -1], delta)
