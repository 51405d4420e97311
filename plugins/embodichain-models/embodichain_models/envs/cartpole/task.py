"""The swing-up task on NeRD's cart-pole: control steps, initial states, the expert, success.

The policy acts at `FPS` = 30 Hz: each action (a cart force, N) is held for two physics
frames of 1/60 s. Episodes start with the pole hanging (θ ≈ π) near the track's centre; an
episode succeeds when the pole stays within `UPRIGHT` rad of upright for the last
`HOLD_S` seconds with the cart inside the track limits.

The expert pumps energy into the pole by accelerating the cart (an energy-shaping law
through partial feedback linearisation, with a pull towards the centre) and, once the pole
is near upright and slow, balances it with a discrete LQR of the linearised control step.
"""

from __future__ import annotations

import math

import torch

from embodichain_models.dynamics.nerd.physics import CartPoleParams, step, wrap_angle

FPS = 30
FRAMES_PER_STEP = 2  # physics frames (1/60 s) per control step
MAX_FORCE = 1500.0
UPRIGHT = 0.25  # rad
HOLD_S = 2.0
TASK = "swing the pole up and balance it"


def control_step(state: torch.Tensor, force: torch.Tensor, params: CartPoleParams
                 ) -> torch.Tensor:
    """Advance states `[N, 4]` by one control step under forces `[N]` (float64 physics)."""
    action = torch.stack((force.to(state.dtype), torch.zeros_like(state[:, 0])), dim=-1)
    for _ in range(FRAMES_PER_STEP):
        state = step(state, action, params)
    return state


def initial_states(count: int, seed: int) -> torch.Tensor:
    """float64 `[count, 4]`: hanging (θ = π ± 0.3), x in ±1 m, small velocities."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(count, 4, generator=gen, dtype=torch.float64) * 2 - 1
    state = u * torch.tensor([1.0, 0.3, 0.5, 0.5], dtype=torch.float64)
    state[:, 1] = wrap_angle(state[:, 1] + math.pi)
    return state


def succeeded(states: torch.Tensor, params: CartPoleParams) -> torch.Tensor:
    """Per episode of states `[N, T, 4]`: upright for the last HOLD_S seconds, on the track."""
    hold = round(HOLD_S * FPS)
    last = states[:, -hold:]
    upright = (last[..., 1].abs() < UPRIGHT).all(1)
    return upright & (states[..., 0].abs() <= params.x_limit).all(1)


class Expert:
    """The swing-up-and-balance controller: `force = expert(states [N, 4])`."""

    def __init__(self, params: CartPoleParams | None = None, energy_gain: float = 0.5,
                 max_acceleration: float = 10.0) -> None:
        self.p = p = params or CartPoleParams()
        self.energy_gain, self.max_acceleration = energy_gain, max_acceleration
        self.ml = p.pole_mass * p.pole_com
        self.m11 = p.cart_mass + p.pole_mass + p.armature
        self.m22 = p.pole_inertia + p.pole_mass * p.pole_com ** 2 + p.armature
        self.gain = self._lqr()

    def _lqr(self) -> torch.Tensor:
        """Gains K (force = −K·state) of the discrete LQR of the linearised control step."""
        zero, eps = torch.zeros(1, 4, dtype=torch.float64), 1e-5
        no_force = torch.zeros(1, dtype=torch.float64)
        columns = []
        for i in range(4):
            d = torch.zeros(1, 4, dtype=torch.float64)
            d[0, i] = eps
            columns.append((control_step(zero + d, no_force, self.p)
                            - control_step(zero - d, no_force, self.p))[0] / (2 * eps))
        a = torch.stack(columns, dim=1)
        b = ((control_step(zero, no_force + eps, self.p)
              - control_step(zero, no_force - eps, self.p))[0] / (2 * eps)).view(4, 1)
        q = torch.diag(torch.tensor([1.0, 50.0, 0.5, 2.0], dtype=torch.float64))
        r = torch.tensor([[1e-5]], dtype=torch.float64)
        p = q.clone()
        for _ in range(3000):  # Riccati iteration to its fixed point
            k = torch.linalg.solve(r + b.T @ p @ b, b.T @ p @ a)
            p = q + a.T @ p @ (a - b @ k)
        return k[0]

    def __call__(self, state: torch.Tensor) -> torch.Tensor:
        state = state.to(torch.float64)
        x, theta, x_dot, theta_dot = state.unbind(-1)
        cos, sin = torch.cos(theta), torch.sin(theta)
        energy = 0.5 * self.m22 * theta_dot ** 2 + self.ml * self.p.gravity * (cos - 1)
        accel = self.energy_gain * energy * theta_dot * cos - 2.0 * x - 3.0 * x_dot
        accel = accel.clamp(-self.max_acceleration, self.max_acceleration)
        # The force that gives the cart this acceleration (from the equations of motion).
        theta_acc = (self.ml * self.p.gravity * sin - self.ml * cos * accel) / self.m22
        swing = self.m11 * accel + self.ml * cos * theta_acc - self.ml * sin * theta_dot ** 2
        balance = -(state @ self.gain.to(state.dtype))
        near = (cos > math.cos(0.5)) & (theta_dot.abs() < 3.0)
        return torch.where(near, balance, swing).clamp(-MAX_FORCE, MAX_FORCE)
