"""A vectorised cart-pole simulator matching the NeRD reference setup.

State `[x, θ, ẋ, θ̇]` with θ = 0 upright; action `[cart force, pole torque]`. The equations
of motion are those of the Lagrangian with generalised coordinates `q = [x, θ]`:

    M(θ) q̈ = rhs,  M = [[m_c + m_p + a,  m_p l cosθ],
                        [m_p l cosθ,      I_p + m_p l² + a]]
    rhs = [F + f_limit + m_p l sinθ θ̇²,  m_p g l sinθ + τ]

where `a` is the joint armature (extra inertia on both diagonal terms, as in articulated-body
simulators) and `f_limit` a penalty spring-damper that keeps the cart inside ±`x_limit`. Each
frame of `dt` seconds takes `substeps` semi-implicit (symplectic) Euler steps, then wraps θ
into [−π, π). Everything is batched over the leading dimension.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

STATE_NAMES = ("x", "theta", "x_dot", "theta_dot")
ACTION_NAMES = ("force", "torque")
THETA = 1  # index of the angle in the state vector


@dataclass(frozen=True)
class CartPoleParams:
    """Physical and integration parameters; the defaults are the NeRD cart-pole."""

    cart_mass: float = 50.0
    pole_mass: float = 2.5
    pole_com: float = 0.5
    """Distance from the hinge to the pole's centre of mass, m."""
    pole_inertia: float = 0.21885
    """Pole inertia about its centre of mass, kg·m²."""
    armature: float = 0.01
    gravity: float = 9.81
    dt: float = 1.0 / 60.0
    substeps: int = 5
    x_limit: float = 4.0
    limit_ke: float = 1.0e4
    limit_kd: float = 10.0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def wrap_angle(theta: torch.Tensor) -> torch.Tensor:
    """Wrap angles into [−π, π)."""
    return torch.remainder(theta + math.pi, 2.0 * math.pi) - math.pi


def limit_force(x: torch.Tensor, x_dot: torch.Tensor, p: CartPoleParams) -> torch.Tensor:
    """Spring-damper force pushing the cart back when it is beyond ±x_limit (zero inside)."""
    over = torch.clamp(x - p.x_limit, min=0.0)
    under = torch.clamp(x + p.x_limit, max=0.0)
    penetration = over + under  # > 0 beyond the right limit, < 0 beyond the left, else 0
    in_contact = penetration != 0
    damping = torch.where(in_contact, p.limit_kd * x_dot, torch.zeros_like(x_dot))
    return -p.limit_ke * penetration - damping


def accelerations(state: torch.Tensor, action: torch.Tensor, p: CartPoleParams) -> torch.Tensor:
    """Generalised accelerations `[ẍ, θ̈]` for states `[..., 4]` and actions `[..., 2]`."""
    x, theta, x_dot, theta_dot = state.unbind(-1)
    force, torque = action.unbind(-1)
    sin, cos = torch.sin(theta), torch.cos(theta)
    ml = p.pole_mass * p.pole_com
    m11 = p.cart_mass + p.pole_mass + p.armature
    m12 = ml * cos
    m22 = p.pole_inertia + p.pole_mass * p.pole_com**2 + p.armature
    r1 = force + limit_force(x, x_dot, p) + ml * sin * theta_dot**2
    r2 = ml * p.gravity * sin + torque
    # Closed-form 2x2 solve: cheaper and exactly reproducible compared with a batched LU.
    det = m11 * m22 - m12 * m12
    x_acc = (m22 * r1 - m12 * r2) / det
    theta_acc = (m11 * r2 - m12 * r1) / det
    return torch.stack((x_acc, theta_acc), dim=-1)


def step(state: torch.Tensor, action: torch.Tensor, p: CartPoleParams) -> torch.Tensor:
    """Advance states `[..., 4]` by one frame under actions `[..., 2]` held for the frame."""
    h = p.dt / p.substeps
    q, q_dot = state[..., :2], state[..., 2:]
    for _ in range(p.substeps):
        q_acc = accelerations(torch.cat((q, q_dot), dim=-1), action, p)
        q_dot = q_dot + h * q_acc  # semi-implicit Euler: velocity first,
        q = q + h * q_dot  # then position with the new velocity
    q = torch.stack((q[..., 0], wrap_angle(q[..., 1])), dim=-1)
    return torch.cat((q, q_dot), dim=-1)


def energy(state: torch.Tensor, p: CartPoleParams) -> torch.Tensor:
    """Total mechanical energy, with the pole's potential measured from its lowest point.

    Ignores the limit spring (meaningful only without limit contact); the armature counts
    as kinetic energy because it enters the mass matrix.
    """
    _, theta, x_dot, theta_dot = state.unbind(-1)
    ml = p.pole_mass * p.pole_com
    m11 = p.cart_mass + p.pole_mass + p.armature
    m22 = p.pole_inertia + p.pole_mass * p.pole_com**2 + p.armature
    kinetic = 0.5 * (m11 * x_dot**2 + 2 * ml * torch.cos(theta) * x_dot * theta_dot
                     + m22 * theta_dot**2)
    potential = ml * p.gravity * (1.0 + torch.cos(theta))
    return kinetic + potential


def simulate(initial: torch.Tensor, actions: torch.Tensor, p: CartPoleParams) -> torch.Tensor:
    """Roll out initial states `[N, 4]` under actions `[N, T, 2]`; returns states `[N, T+1, 4]`.

    Integrates in float64 whatever the input dtype, so the stored float32 data is the
    rounding of an accurate trajectory rather than an accumulation of float32 errors.
    """
    state = initial.to(torch.float64)
    actions = actions.to(torch.float64)
    states = [state]
    for t in range(actions.shape[1]):
        state = step(state, actions[:, t], p)
        states.append(state)
    return torch.stack(states, dim=1)


@dataclass(frozen=True)
class SamplingRanges:
    """Uniform ranges of the random initial states and forces (NeRD defaults)."""

    x: float = 3.5
    theta: float = math.pi
    x_dot: float = 10.0
    theta_dot: float = 10.0
    force: float = 1500.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def random_trajectories(
    num: int,
    steps: int,
    seed: int,
    params: CartPoleParams | None = None,
    ranges: SamplingRanges | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simulate `num` random trajectories of `steps` frames, deterministically from `seed`.

    Returns float64 `states [num, steps+1, 4]` and `actions [num, steps, 2]`; the pole
    torque is always zero, the force is drawn afresh every frame.
    """
    params = params or CartPoleParams()
    ranges = ranges or SamplingRanges()
    gen = torch.Generator().manual_seed(seed)
    half = torch.tensor([ranges.x, ranges.theta, ranges.x_dot, ranges.theta_dot],
                        dtype=torch.float64)
    initial = (torch.rand(num, 4, generator=gen, dtype=torch.float64) * 2 - 1) * half
    force = (torch.rand(num, steps, generator=gen, dtype=torch.float64) * 2 - 1) * ranges.force
    actions = torch.stack((force, torch.zeros_like(force)), dim=-1)
    return simulate(initial, actions, params), actions
