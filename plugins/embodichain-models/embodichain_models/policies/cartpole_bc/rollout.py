"""The cart-pole closed loop written out by hand, batched over episodes: the expert's success
rate from the evaluation's starts (reported beside the policy's), and the policy's loop as
it ran before it moved onto embodichain's evaluation (`env.CartPoleSwingUp` with
`policy.ChunkExecution`), kept as the reference that the evaluation's outcomes are checked
against, episode by episode (tests/models/cartpole_bc).

Episode e of an evaluation with seed s starts from `initial_states(1, s + e)`, as the
environment's `reset(seed=s + e)` does.
"""

from __future__ import annotations

import torch

from embodichain_models.dynamics.nerd.physics import CartPoleParams
from embodichain_models.envs.cartpole.render import render
from embodichain_models.envs.cartpole.task import (
    MAX_FORCE,
    Expert,
    control_step,
    initial_states,
    succeeded,
)


def evaluation_starts(episodes: int, seed: int) -> torch.Tensor:
    """float64 `[episodes, 4]`: the starts of episodes 0..episodes-1 of an evaluation."""
    return torch.cat([initial_states(1, seed + e) for e in range(episodes)])


def run_expert(starts: torch.Tensor, steps: int, params: CartPoleParams) -> torch.Tensor:
    expert, state, states = Expert(params), starts, []
    for _ in range(steps):
        states.append(state)
        state = control_step(state, expert(state), params)
    return torch.stack(states, 1)


def expert_success_rate(episodes: int, seed: int, steps: int) -> float:
    """The expert's success rate from the evaluation's starts."""
    params = CartPoleParams()
    states = run_expert(evaluation_starts(episodes, seed), steps, params)
    return succeeded(states, params).double().mean().item()


@torch.no_grad()
def run_policy(policy: torch.nn.Module, starts: torch.Tensor, steps: int, frames: int,
               size: int, execute: int, params: CartPoleParams, device: torch.device
               ) -> torch.Tensor:
    """States `[N, steps, 4]` of the closed loop (float64 physics on the CPU)."""
    state, states = starts, []
    history: list[torch.Tensor] = []
    plan: torch.Tensor | None = None
    for t in range(steps):
        states.append(state)
        image = render(state.to(torch.float32), size).float().div_(255.0)
        history = (history or [image] * frames)[1:] + [image]
        if t % execute == 0:
            images = torch.stack(history, 1).to(device)
            plan = policy.forces(images, state.to(torch.float32).to(device)).cpu()
        assert plan is not None
        force = plan[:, t % execute].to(torch.float64).clamp(-MAX_FORCE, MAX_FORCE)
        state = control_step(state, force, params)
    return torch.stack(states, 1)
