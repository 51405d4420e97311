"""History windows over simulated trajectories, and the training-split statistics."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from embodichain_models.dynamics.nerd.model import state_delta


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def normalization_stats(states: torch.Tensor, actions: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-dimension mean and (population) variance of the model inputs `[state, action]`
    and targets (Δstate, θ wrapped) over every step of every trajectory, in float64."""
    states = states.to(torch.float64)
    inputs = torch.cat((states[:, :-1], actions.to(torch.float64)), dim=-1).flatten(0, 1)
    targets = state_delta(states).flatten(0, 1)
    return {
        "input_mean": inputs.mean(0),
        "input_var": inputs.var(0, correction=0),
        "target_mean": targets.mean(0),
        "target_var": targets.var(0, correction=0),
    }


class WindowSource:
    """Every length-`window` slice of every trajectory, as one training example.

    Example `i` is trajectory `i // starts`, frames `i % starts ...` where `starts = T − window
    + 1`. `gather` returns `states [B, W, 4]`, `actions [B, W, 2]` and the raw state changes
    `deltas [B, W, 4]` (Δ_t = s_{t+1} − s_t, θ wrapped). The tensors may be memory-mapped:
    only the gathered rows are read, so ranks on one node share the file's pages.
    """

    def __init__(self, states: torch.Tensor, actions: torch.Tensor, window: int,
                 identity: str) -> None:
        n, steps = actions.shape[:2]
        if states.shape[:2] != (n, steps + 1):
            raise ValueError(f"states {tuple(states.shape)} do not match actions "
                             f"{tuple(actions.shape)}: expected [N, T+1, 4] and [N, T, 2]")
        if steps < window:
            raise ValueError(f"trajectories of {steps} steps are shorter than the window {window}")
        self.states, self.actions, self.window = states, actions, window
        self.starts = steps - window + 1
        self.identity = identity
        self._length = n * self.starts

    def __len__(self) -> int:
        return self._length

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        traj = (indices // self.starts).unsqueeze(1)
        frames = (indices % self.starts).unsqueeze(1) + torch.arange(self.window + 1)
        states = self.states[traj, frames]  # [B, W+1, 4]: the window plus the next state
        return {
            "states": states[:, :-1],
            "actions": self.actions[traj, frames[:, :-1]],
            "deltas": state_delta(states),
        }
