"""A recipe judged in closed loop (R-EVAL-1..3): a tiny pure-Python gymnasium environment.

`Reach`: a point on a line starts at x0 (drawn from the reset seed) and must be brought
within `tolerance` of 0; the action moves it by `gain * a`, a in [-1, 1]; reward -|x|.
The episode terminates with `info["is_success"]` when it is reached. Faults on request, each
in the episode reset with a given seed: `raise_at` (an exception at step 3), `nan_at`
(a NaN observation at step 2), `sleep_at` (each step sleeps `sleep_s`); with `stays_broken`
an environment that raised keeps raising (only a new one works). Rendered as a small RGB
strip (the point's column lit), so episodes can be filmed; `frames` renders it otherwise:
"gray" (`[H, W]` uint8), "float" (in [0, 1]), "raise" (the renderer fails from step 2 on),
"slow" (each frame takes `sleep_s`). With `REACH_NO_GL=1` in the environment it cannot
render at all (as MuJoCo without an OpenGL backend).

The factory (`closed_loop:build_supervised_trainer`, tests/factories on PYTHONPATH) trains
a one-layer linear policy to output -x / gain (clipped), and gives the evaluation the
policy `act(obs) = model(obs)`. Its recipe's `evaluation.env.constructor` is
`closed_loop:make_reach`. With `data.policy_weight: w` the acting layer is fixed at
`a = w * x` (not trained; an auxiliary layer is), so every world size and strategy acts with
the same weights, bitwise; `data.acts_log: DIR` appends one line per policy call to
`DIR/rank{R}.txt` (the test counts each rank's forwards).

For the stop tests (R-EVAL-4), set in the environment, so that the recipe (and with it the
resume) stays the same: EMBODICHAIN_TEST_EVAL_STEP_S makes every step of every episode sleep
that long (a slow simulator), EMBODICHAIN_TEST_EVAL_MARK names a file that each episode's first
step appends a line to (an evaluation is under way: the process, the seed and its SIGTERM
handler; not the reset, which the admission check also does, before training), and
EMBODICHAIN_TEST_SIGTERM_AT=U makes each process send itself SIGTERM in update U's loss (the
stop is then agreed at a later update).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from embodichain.learning.sl import LossResult, Section, SupervisedTrainer, TensorSource


class Reach(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, gain: float = 0.3, tolerance: float = 0.05, render_mode: str | None = None,
                 raise_at: int | None = None, nan_at: int | None = None,
                 sleep_at: int | None = None, sleep_s: float = 0.0,
                 stays_broken: bool = False, frames: str = "rgb", dim: int = 1,
                 dtype: str = "float32") -> None:
        self.gain, self.tolerance, self.render_mode = gain, tolerance, render_mode
        self.stays_broken, self.broken, self.frames = stays_broken, False, frames
        self.faults = {"raise": raise_at, "nan": nan_at, "sleep": sleep_at}
        self.sleep_s = sleep_s
        # `dim`, `dtype`: observations a policy of one float32 input cannot take (refusals)
        self.dim, self.dtype = dim, np.dtype(dtype)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (dim,), self.dtype)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x, self.seed_, self.t = 0.0, None, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self.broken:
            raise RuntimeError("still broken since its fault")
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return np.full(self.dim, self.x, self.dtype), {}

    def step(self, action: Any):
        self.t += 1
        mark = os.environ.get("EMBODICHAIN_TEST_EVAL_MARK")
        if mark and self.t == 1:  # not at reset: the admission check resets before training
            with open(mark, "a") as f:
                f.write(f"{os.getpid()} {self.seed_} {signal.getsignal(signal.SIGTERM)!r}\n")
        time.sleep(float(os.environ.get("EMBODICHAIN_TEST_EVAL_STEP_S", "0")))
        if self.broken:
            raise RuntimeError("still broken since its fault")
        if self.seed_ == self.faults["raise"] and self.t == 3:
            self.broken = self.stays_broken
            raise RuntimeError("the simulator broke at step 3")
        if self.seed_ == self.faults["sleep"]:
            time.sleep(self.sleep_s)
        self.x += self.gain * float(np.clip(np.asarray(action).reshape(-1)[0], -1.0, 1.0))
        reached = abs(self.x) < self.tolerance
        obs = np.full(self.dim, self.x, self.dtype)
        if self.seed_ == self.faults["nan"] and self.t == 2:
            obs[0] = np.nan
        return obs, -abs(self.x), reached, False, {"is_success": reached}

    def render(self):
        if os.environ.get("REACH_NO_GL"):
            raise RuntimeError("no OpenGL context (REACH_NO_GL is set)")
        strip = np.full((8, 24, 3), 30, np.uint8)
        column = int(np.clip((self.x + 1.0) / 2.0 * 23, 0, 23))
        strip[:, column] = (250, 200, 40)
        if self.frames == "gray":
            return strip[..., 0].copy()
        if self.frames == "float":
            return strip.astype(np.float32) / 255.0
        if self.frames == "raise" and self.t >= 2:
            raise RuntimeError("the renderer lost its GL context")
        if self.frames == "slow":
            time.sleep(self.sleep_s)
        return strip


def make_reach(**kwargs: Any) -> Reach:
    return Reach(**kwargs)


class Data(Section):
    size: int = 512
    seed: int = 3
    policy_weight: float | None = None
    acts_log: str | None = None


class ClosedLoopRecipe(Section):
    data: Data = Data()


class Net(nn.Module):
    """`net(x)`: the acting layer; `net(x, aux=True)`: the trained one when it is fixed."""

    def __init__(self, weight: float | None) -> None:
        super().__init__()
        self.act, self.aux = nn.Linear(1, 1), nn.Linear(1, 1)
        if weight is not None:
            with torch.no_grad():
                self.act.weight.fill_(weight)
                self.act.bias.zero_()
            self.act.requires_grad_(False)
        else:  # unused: DDP must not wait for its gradient
            self.aux.requires_grad_(False)

    def forward(self, x: torch.Tensor, aux: bool = False) -> torch.Tensor:
        return self.aux(x) if aux else self.act(x)


class LinearPolicy:
    """`act(obs [N, 1]) -> actions [N, 1]`: the model's output, one batched forward."""

    def __init__(self, model: nn.Module, device: torch.device, log: str | None) -> None:
        if not isinstance(model, Net):  # the EMA's weights too (R-EVAL-5): Net's methods
            raise TypeError(f"the policy was given a {type(model).__name__}, not a Net")
        self.model, self.device = model, device
        self.log = None
        if log is not None:
            rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
            self.log = f"{log}/rank{rank}.txt"

    def reset(self, env_index: int) -> None:
        pass

    def act(self, observations: np.ndarray) -> torch.Tensor:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{len(observations)}\n")
        return self.model(torch.as_tensor(observations, device=self.device))


def build_supervised_trainer(config: ClosedLoopRecipe, device: torch.device
                             ) -> SupervisedTrainer:
    g = torch.Generator().manual_seed(config.data.seed)
    x = torch.rand(config.data.size, 1, generator=g) * 2 - 1
    source = TensorSource({"x": x, "y": (-x / 0.3).clamp(-1, 1)})
    fixed = config.data.policy_weight is not None
    model = Net(config.data.policy_weight)
    sigterm_at = int(os.environ.get("EMBODICHAIN_TEST_SIGTERM_AT", "0"))
    trainer: SupervisedTrainer | None = None

    def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
        if sigterm_at and trainer is not None and trainer.step + 1 == sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)
        loss = (model(batch["x"], aux=fixed) - batch["y"]).square().mean()
        return LossResult(loss=loss, weight=float(len(batch["x"])))

    def make_policy(model: nn.Module, device: torch.device) -> LinearPolicy:
        return LinearPolicy(model, device, config.data.acts_log)

    trainer = SupervisedTrainer(config, model=model, source=source, objective=objective,
                                device=device, policy=make_policy)
    return trainer


build_supervised_trainer.config_schema = ClosedLoopRecipe
