"""Closed-loop validation: the policy drives the simulated cart-pole from the camera.

From `episodes` hanging starts (their own seed, not the demonstrations'), the policy sees
the rendered frames (the last `frames` ones, the first repeated at the start as the
dataset pads) and the state, predicts a chunk and the first `execute` forces are applied
before it looks again. `validation/success_rate` is the fraction of episodes upright for
the last two seconds; the expert's rate from the same starts is reported beside it.
"""

from __future__ import annotations

from typing import Any

import torch

from embodichain_models.dynamics.nerd.physics import CartPoleParams
from embodichain_models.perception.cartpole_pixels.render import render
from embodichain_models.policies.cartpole_bc.prepare import IMAGE_KEY
from embodichain_models.policies.cartpole_bc.task import (
    MAX_FORCE,
    Expert,
    control_step,
    initial_states,
    succeeded,
)


def run_expert(starts: torch.Tensor, steps: int, params: CartPoleParams) -> torch.Tensor:
    expert, state, states = Expert(params), starts, []
    for _ in range(steps):
        states.append(state)
        state = control_step(state, expert(state), params)
    return torch.stack(states, 1)


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


def run_agent(agent: Any, starts: torch.Tensor, steps: int, frames: int, size: int,
              params: CartPoleParams) -> torch.Tensor:
    """States `[N, steps, 4]` of the closed loop driven by `agent` (an exported policy's
    runner, or anything with `reset(env_index)` and `act(observations) -> [N, 1]` forces):
    the same frames, physics and force limit as `run_policy`, the chunk execution the
    agent's own. Observations are float32 numpy arrays under the policy's keys."""
    state, states = starts, []
    history: list[torch.Tensor] = []
    agent.reset(None)
    for _ in range(steps):
        states.append(state)
        image = render(state.to(torch.float32), size).float().div_(255.0)
        history = (history or [image] * frames)[1:] + [image]
        action = agent.act({IMAGE_KEY: torch.stack(history, 1).numpy(),
                            "observation.state": state.to(torch.float32).numpy()})
        force = torch.as_tensor(action)[:, 0].to(torch.float64).clamp(-MAX_FORCE, MAX_FORCE)
        state = control_step(state, force, params)
    return torch.stack(states, 1)


class ClosedLoop:
    """`evaluate(model, device)`: the success rates of the policy and of the expert."""

    def __init__(self, episodes: int, steps: int, seed: int, frames: int, size: int,
                 execute: int) -> None:
        self.params = CartPoleParams()
        self.starts = initial_states(episodes, seed)
        self.steps, self.frames, self.size, self.execute = steps, frames, size, execute
        self._expert_rate: float | None = None

    def __call__(self, model: torch.nn.Module, device: torch.device) -> dict[str, float]:
        if self._expert_rate is None:
            expert = run_expert(self.starts, self.steps, self.params)
            self._expert_rate = succeeded(expert, self.params).double().mean().item()
        policy = getattr(model, "module", model)
        states = run_policy(policy, self.starts, self.steps, self.frames, self.size,
                            self.execute, self.params, device)
        final = states[:, -1]
        return {"validation/success_rate": succeeded(states, self.params).double().mean().item(),
                "validation/expert_success_rate": self._expert_rate,
                "validation/final_abs_theta": final[:, 1].abs().mean().item()}
