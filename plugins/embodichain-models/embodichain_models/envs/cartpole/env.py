"""The swing-up task as a gymnasium environment: NeRD's cart-pole physics and its camera.

`reset(seed=s)` hangs the pole from a start drawn from `s` (`task.initial_states(1, s)`:
θ = π ± 0.3, x in ±1 m, small velocities); an action is the cart force in newtons (clamped
to ±MAX_FORCE), held for one control step (two physics frames, 1/30 s). The observation is
the camera frame `image` (uint8 `[3, size, size]`, as the demonstrations' video) and the
`state` `[x, θ, ẋ, θ̇]` (float32). The reward is cos θ of the state acted on (1 upright, −1
hanging), so the return says how long and how well the pole stood.
`info["is_success"]`: over the states the policy has acted on so far, the pole upright at
each of the last HOLD_S seconds and the cart never beyond the track's limits, which at the
recipe's 180 steps is the task's success (`task.succeeded`). The episode never ends by
itself: the evaluation's `max_steps` ends it. `render()` draws the scene at `render_size`.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch

from embodichain_models.dynamics.nerd.physics import CartPoleParams
from embodichain_models.envs.cartpole.render import render
from embodichain_models.envs.cartpole.task import (
    FPS,
    HOLD_S,
    MAX_FORCE,
    UPRIGHT,
    control_step,
    initial_states,
)


class CartPoleSwingUp(gymnasium.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}

    def __init__(self, size: int = 64, render_size: int = 192,
                 render_mode: str | None = None) -> None:
        self.size, self.render_size, self.render_mode = size, render_size, render_mode
        self.params = CartPoleParams()
        self.observation_space = gymnasium.spaces.Dict({
            "image": gymnasium.spaces.Box(0, 255, (3, size, size), np.uint8),
            "state": gymnasium.spaces.Box(-np.inf, np.inf, (4,), np.float32)})
        self.action_space = gymnasium.spaces.Box(-MAX_FORCE, MAX_FORCE, (1,), np.float32)
        self.hold = round(HOLD_S * FPS)
        self.state = torch.zeros(1, 4, dtype=torch.float64)
        self.upright: list[bool] = []  # of the states acted on
        self.on_track = True

    def _observation(self) -> dict[str, np.ndarray]:
        state = self.state.to(torch.float32)
        return {"image": render(state, self.size)[0].numpy(), "state": state[0].numpy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        if seed is None:  # gymnasium's own stream: a start all the same
            seed = int(self.np_random.integers(2**31))
        self.state = initial_states(1, seed)
        self.upright, self.on_track = [], True
        return self._observation(), {"is_success": False}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool,
                                         dict[str, Any]]:
        acted_on = self.state[0]  # the state the policy saw when it chose this force
        self.upright.append(bool(acted_on[1].abs() < UPRIGHT))
        self.on_track &= bool(acted_on[0].abs() <= self.params.x_limit)
        force = torch.as_tensor(np.asarray(action, dtype=np.float32).reshape(-1)[:1]
                                ).to(torch.float64).clamp(-MAX_FORCE, MAX_FORCE)
        self.state = control_step(self.state, force, self.params)
        success = (len(self.upright) >= self.hold and all(self.upright[-self.hold:])
                   and self.on_track)
        return self._observation(), float(torch.cos(acted_on[1])), False, False, \
            {"is_success": success}

    def render(self) -> np.ndarray:
        return render(self.state.to(torch.float32), self.render_size)[0].permute(1, 2, 0).numpy()
