"""Diffusion Policy's conditional 1-D U-Net (lerobot's `DiffusionConditionalUnet1d`): the
noisy action horizon `[B, horizon, action_dim]` is a 1-D signal over time with the actions
as channels; each level has two residual blocks FiLM-conditioned on the diffusion step's
embedding and the observation's features, then halves the horizon (a strided convolution);
the way up doubles it (a transposed convolution) and concatenates the level's skip. The
output is the predicted noise, the input's shape."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class StepEmbedding(nn.Module):
    """The diffusion level t `[B]` as sinusoids `[B, dim]`, then an MLP (lerobot's)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        half = dim // 2
        scale = math.log(10000) / max(half - 1, 1)
        self.register_buffer("frequencies", torch.exp(torch.arange(half) * -scale),
                             persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * half, dim * 4), nn.Mish(), nn.Linear(dim * 4, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        angles = t.to(self.frequencies.dtype)[:, None] * self.frequencies[None]
        return self.mlp(torch.cat([angles.sin(), angles.cos()], -1))


class ConvBlock(nn.Sequential):
    """Conv1d, GroupNorm, Mish."""

    def __init__(self, inputs: int, outputs: int, kernel: int, groups: int) -> None:
        super().__init__(nn.Conv1d(inputs, outputs, kernel, padding=kernel // 2),
                         nn.GroupNorm(groups, outputs), nn.Mish())


class FilmResidualBlock(nn.Module):
    """Two conv blocks, the first's output scaled and shifted per channel by a linear map of
    the conditioning (FiLM), plus the input (a 1x1 convolution when widths differ)."""

    def __init__(self, inputs: int, outputs: int, condition: int, kernel: int, groups: int,
                 scale: bool) -> None:
        super().__init__()
        self.outputs, self.scale = outputs, scale
        self.conv1 = ConvBlock(inputs, outputs, kernel, groups)
        self.film = nn.Sequential(nn.Mish(), nn.Linear(condition, outputs * (2 if scale else 1)))
        self.conv2 = ConvBlock(outputs, outputs, kernel, groups)
        self.residual = nn.Conv1d(inputs, outputs, 1) if inputs != outputs else nn.Identity()

    def forward(self, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        film = self.film(condition).unsqueeze(-1)
        if self.scale:
            out = film[:, :self.outputs] * out + film[:, self.outputs:]
        else:
            out = out + film
        return self.conv2(out) + self.residual(x)


class ConditionalUnet1d(nn.Module):
    """`unet(x [B, T, A], t [B], condition [B, C]) -> [B, T, A]` (see the module)."""

    def __init__(self, action_dim: int, condition_dim: int, down_dims: Sequence[int],
                 kernel: int = 5, groups: int = 8, step_dim: int = 64,
                 film_scale: bool = True) -> None:
        super().__init__()
        self.step = StepEmbedding(step_dim)
        cond = step_dim + condition_dim
        widths = [action_dim, *down_dims]
        pairs = list(zip(widths[:-1], widths[1:], strict=True))

        def block(i: int, o: int) -> FilmResidualBlock:
            return FilmResidualBlock(i, o, cond, kernel, groups, film_scale)

        self.down = nn.ModuleList(
            nn.ModuleList([block(i, o), block(o, o),
                           nn.Conv1d(o, o, 3, 2, 1) if n < len(pairs) - 1 else nn.Identity()])
            for n, (i, o) in enumerate(pairs))
        self.mid = nn.ModuleList([block(down_dims[-1], down_dims[-1]),
                                  block(down_dims[-1], down_dims[-1])])
        ups = list(reversed(pairs[1:]))
        self.up = nn.ModuleList(
            nn.ModuleList([block(o * 2, i), block(i, i),
                           nn.ConvTranspose1d(i, i, 4, 2, 1)])
            for i, o in ups)  # every level up doubles (the deepest down level did not halve)
        self.final = nn.Sequential(ConvBlock(down_dims[0], down_dims[0], kernel, groups),
                                   nn.Conv1d(down_dims[0], action_dim, 1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, condition: torch.Tensor
                ) -> torch.Tensor:
        cond = torch.cat([self.step(t), condition], -1)
        x = x.transpose(1, 2)
        skips = []
        for first, second, resample in self.down:  # type: ignore[misc]
            x = second(first(x, cond), cond)
            skips.append(x)
            x = resample(x)
        for module in self.mid:
            x = module(x, cond)
        for first, second, resample in self.up:  # type: ignore[misc]
            x = second(first(torch.cat([x, skips.pop()], 1), cond), cond)
            x = resample(x)
        return self.final(x).transpose(1, 2)
