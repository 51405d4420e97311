"""History windows over simulated trajectories, and the training-split statistics."""

from __future__ import annotations

import torch

from embodichain_models.dynamics.nerd.model import state_delta


def normalization_stats(states: torch.Tensor, actions: torch.Tensor,
                        chunk: int = 1024) -> dict[str, torch.Tensor]:
    """Per-dimension mean and (population) variance of the model inputs `[state, action]`
    and targets (Δstate, θ wrapped) over every step of every trajectory, in float64.

    Two passes over chunks of trajectories (exact and stable, like `var`), so the float64
    temporaries stay small whatever the dataset size: the memory-mapped data is the only
    large thing a rank holds.
    """

    def chunks():
        for lo in range(0, len(actions), chunk):
            s = states[lo:lo + chunk].to(torch.float64)
            a = actions[lo:lo + chunk].to(torch.float64)
            yield (torch.cat((s[:, :-1], a), dim=-1).flatten(0, 1),
                   state_delta(s).flatten(0, 1))

    count = actions.shape[0] * actions.shape[1]
    in_sum = torch.zeros(states.shape[-1] + actions.shape[-1], dtype=torch.float64)
    out_sum = torch.zeros(states.shape[-1], dtype=torch.float64)
    for inputs, targets in chunks():
        in_sum += inputs.sum(0)
        out_sum += targets.sum(0)
    in_mean, out_mean = in_sum / count, out_sum / count
    in_sq, out_sq = torch.zeros_like(in_sum), torch.zeros_like(out_sum)
    for inputs, targets in chunks():
        in_sq += (inputs - in_mean).square().sum(0)
        out_sq += (targets - out_mean).square().sum(0)
    return {
        "input_mean": in_mean,
        "input_var": in_sq / count,
        "target_mean": out_mean,
        "target_var": out_sq / count,
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
