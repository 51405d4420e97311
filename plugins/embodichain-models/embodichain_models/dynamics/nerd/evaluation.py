"""Rank-0 validation of a NeRD model: one-step error and autoregressive rollouts.

Every figure is reported beside a constant-velocity baseline (positions advance by
velocity × dt, velocities stay), the simplest model that uses the same information.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from embodichain_models.dynamics.nerd.model import NerdTransformer, apply_delta, state_delta
from embodichain_models.dynamics.nerd.physics import STATE_NAMES, THETA, wrap_angle

DEFAULT_HORIZONS = (1, 10, 50, 100)


def state_error(pred: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """Squared error per state dimension, with the θ difference wrapped."""
    diff = pred - true
    theta = wrap_angle(diff[..., THETA])
    diff = torch.cat((diff[..., :THETA], theta.unsqueeze(-1), diff[..., THETA + 1:]), dim=-1)
    return diff.square()


def constant_velocity_delta(states: torch.Tensor, dt: float) -> torch.Tensor:
    """Δstate of the constant-velocity baseline: `[ẋ dt, θ̇ dt, 0, 0]`."""
    return torch.cat((states[..., 2:] * dt, torch.zeros_like(states[..., 2:])), dim=-1)


class RolloutEvaluator:
    """Evaluates a model on validation trajectories `states [N, T+1, 4]`, `actions [N, T, 2]`.

    One-step predictions use the true history: the context grows to the window over the
    first steps of a trajectory, then slides, exactly as in a rollout, so every transition
    of every trajectory counts once. Rollouts start from each trajectory's first state and
    feed predictions back with the true actions.
    """

    def __init__(self, states: torch.Tensor, actions: torch.Tensor, dt: float,
                 horizons: Sequence[int] = DEFAULT_HORIZONS, chunk: int = 1024) -> None:
        self.states = states.to(torch.float32)
        self.actions = actions.to(torch.float32)
        self.dt = dt
        steps = actions.shape[1]
        self.horizons = [h for h in horizons if h <= steps]  # longer ones need longer data
        self.chunk = chunk
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _data(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._on:  # copied to the device once, at the first validation
            self._on[device] = (self.states.to(device), self.actions.to(device))
        return self._on[device]

    def _forward_last(self, model: NerdTransformer, states: torch.Tensor,
                      actions: torch.Tensor) -> torch.Tensor:
        """Prediction at the last position of each history `[B, W, ·]`, in chunks."""
        outs = [model(s, a)[:, -1].float()
                for s, a in zip(states.split(self.chunk), actions.split(self.chunk), strict=True)]
        return torch.cat(outs)

    def one_step(self, model: NerdTransformer, states: torch.Tensor,
                 actions: torch.Tensor) -> torch.Tensor:
        """Normalised Δ predictions `[N, T, 4]` for every transition, given the true history."""
        n, steps = actions.shape[:2]
        window = min(model.cfg.window, steps)
        # The first window−1 steps have shorter contexts; prefixes keep this right for a
        # non-causal model too (a full window would show it later tokens).
        preds = [self._forward_last(model, states[:, :t + 1], actions[:, :t + 1])
                 for t in range(window - 1)]
        # Sliding windows ending at steps window−1 ... T−1: unfold gives [N, S, dim, W].
        s_win = states[:, :steps].unfold(1, window, 1).permute(0, 1, 3, 2).flatten(0, 1)
        a_win = actions.unfold(1, window, 1).permute(0, 1, 3, 2).flatten(0, 1)
        slid = self._forward_last(model, s_win, a_win).view(n, steps - window + 1, -1)
        return torch.cat([p.unsqueeze(1) for p in preds] + [slid], dim=1)

    def rollout(self, model: NerdTransformer, states: torch.Tensor,
                actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Model and baseline rollouts `[N, T+1, 4]` from the first state of each trajectory."""
        window = model.cfg.window
        pred = [states[:, 0]]
        base = [states[:, 0]]
        for t in range(actions.shape[1]):
            lo = max(0, t - window + 1)
            history = torch.stack(pred[lo:t + 1], dim=1)
            pred.append(model.predict_next(history, actions[:, lo:t + 1]))
            base.append(apply_delta(base[-1], constant_velocity_delta(base[-1], self.dt)))
        return torch.stack(pred, dim=1), torch.stack(base, dim=1)

    @torch.no_grad()
    def __call__(self, model: NerdTransformer, device: torch.device) -> dict[str, float]:
        states, actions = self._data(device)
        metrics: dict[str, float] = {}

        pred_norm = self.one_step(model, states, actions)
        true_delta = state_delta(states)
        base_delta = constant_velocity_delta(states[:, :-1], self.dt)
        true_norm = model.normalize_target(true_delta)
        metrics["validation/mse"] = (pred_norm - true_norm).square().mean().item()
        metrics["validation/baseline_mse"] = (
            (model.normalize_target(base_delta) - true_norm).square().mean().item())
        # Per-dimension one-step error of the next state, in state units.
        model_err = state_error(apply_delta(states[:, :-1], model.denormalize_target(pred_norm)),
                                states[:, 1:]).mean((0, 1))
        base_err = state_error(apply_delta(states[:, :-1], base_delta), states[:, 1:]).mean((0, 1))
        for i, name in enumerate(STATE_NAMES):
            metrics[f"validation/one_step_mse_{name}"] = model_err[i].item()
            metrics[f"validation/baseline_one_step_mse_{name}"] = base_err[i].item()

        pred_roll, base_roll = self.rollout(model, states, actions)
        for h in self.horizons:
            metrics[f"validation/rollout_mse_h{h}"] = (
                state_error(pred_roll[:, h], states[:, h]).mean().item())
            metrics[f"validation/baseline_rollout_mse_h{h}"] = (
                state_error(base_roll[:, h], states[:, h]).mean().item())
        return metrics
