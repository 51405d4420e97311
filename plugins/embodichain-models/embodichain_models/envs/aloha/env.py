"""The ALOHA tasks as gymnasium environments observing state, rendering only on request.

    import embodichain_models.envs                  # registers the ids
    env = gymnasium.make("embodichain_models/AlohaTransferCube-v0")
    obs, info = env.reset(seed=100_000)
    obs, reward, terminated, truncated, info = env.step(action)   # action: 14 joint targets

With `obs_type="state"` (the default) observations are a dict of float32 arrays named as
the dataset's features: `observation.state` (the 14 joint positions, grippers normalised)
and `observation.environment_state` (the objects' poses, privileged), plus
`observation.images.<camera>` (uint8 `[H, W, 3]`) for each camera in `cameras`. With
`obs_type="pixels_agent_pos"` they are gym-aloha's own: `{"pixels": {"top": uint8
[480, 640, 3]}, "agent_pos": float64 [14]}`, the top camera rendered as gym-aloha renders it
(bit for bit: same scene, size and effects), and only that camera, where gym-aloha's task
renders three (top, angle, front_close) every step. The reward is gym-aloha's (0 to 4), and
`info["is_success"]` is true at a step with the top reward; an episode terminates there,
as gym-aloha's environments do, unless `terminate_on_success=False` (the example recipes'
evaluation: the episode runs to its limit, so the task can be judged at the last step).
`info["task_done"]` says whether the task is done in the present state (`Scene.task_done`:
the top reward's own condition at this step, so the strict verdict is never looser).
`render()` (render_mode "rgb_array") draws `render_camera`; nothing is
rendered otherwise, so a step costs the physics only (under a millisecond here, where a
gym-aloha step renders three 480x640 cameras).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from embodichain_models.envs.aloha.scene import RenderingUnavailable, Scene
from embodichain_models.envs.aloha.tasks import (
    CAMERA_FRAME,
    FPS,
    JOINT_NAMES,
    MAX_REWARD,
    task_named,
)


class AlohaEnv(gym.Env):
    """gym-aloha's joint-space scene of `task` ("transfer_cube" or "insertion")."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}

    def __init__(self, task: str = "transfer_cube", cameras: Sequence[str] = (),
                 image_size: Sequence[int] = CAMERA_FRAME, render_mode: str | None = None,
                 render_camera: str = "top", render_size: Sequence[int] = CAMERA_FRAME,
                 obs_type: str = "state", terminate_on_success: bool = True) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode {render_mode!r}: only 'rgb_array' (or None)")
        if obs_type not in ("state", "pixels_agent_pos"):
            raise ValueError(f"obs_type {obs_type!r}: 'state' or 'pixels_agent_pos'")
        if obs_type == "pixels_agent_pos" and list(cameras) not in ([], ["top"]):
            raise ValueError(f"obs_type 'pixels_agent_pos' is gym-aloha's top camera, not "
                             f"cameras {list(cameras)}")
        self.task = task_named(task)
        self.scene = Scene(self.task)
        self.obs_type = obs_type
        self._top = np.zeros((*CAMERA_FRAME, 3), np.uint8)
        if obs_type == "pixels_agent_pos":
            cameras, image_size = ["top"], CAMERA_FRAME
        self.cameras, self.image_size = list(cameras), tuple(int(s) for s in image_size)
        self.render_mode, self.render_camera = render_mode, render_camera
        self.render_size = tuple(int(s) for s in render_size)
        self.terminate_on_success = bool(terminate_on_success)
        for camera in self.cameras + ([render_camera] if render_mode else []):
            self.scene.check_camera(camera)
        n_env = len(self.task.env_state_names)
        if obs_type == "pixels_agent_pos":  # gym-aloha's space, as its env declares it
            self.observation_space = spaces.Dict({
                "pixels": spaces.Dict({"top": spaces.Box(0, 255, (*CAMERA_FRAME, 3),
                                                         np.uint8)}),
                "agent_pos": spaces.Box(-1000.0, 1000.0, (len(JOINT_NAMES),), np.float64)})
        observation = {
            "observation.state": spaces.Box(-np.inf, np.inf, (len(JOINT_NAMES),), np.float32),
            "observation.environment_state": spaces.Box(-np.inf, np.inf, (n_env,), np.float32)}
        for camera in self.cameras:
            observation[f"observation.images.{camera}"] = spaces.Box(
                0, 255, (*self.image_size, 3), np.uint8)
        if obs_type == "state":
            self.observation_space = spaces.Dict(observation)
        model = self.scene.physics.model
        arm = [model.jnt_range[i] for side in (0, 8) for i in range(side, side + 6)]
        low = np.array([*(r[0] for r in arm[:6]), 0.0, *(r[0] for r in arm[6:]), 0.0])
        high = np.array([*(r[1] for r in arm[:6]), 1.0, *(r[1] for r in arm[6:]), 1.0])
        self.action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32),
                                       dtype=np.float32)

    def _observation(self) -> dict[str, Any]:
        if self.obs_type == "pixels_agent_pos":
            self._top = self.scene.render("top", *CAMERA_FRAME)
            return {"pixels": {"top": self._top}, "agent_pos": self.scene.qpos.copy()}
        obs = {"observation.state": self.scene.qpos.astype(np.float32),
               "observation.environment_state": self.scene.env_state.astype(np.float32)}
        for camera in self.cameras:
            obs[f"observation.images.{camera}"] = self.scene.render(camera, *self.image_size)
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Objects placed by gym-aloha's sampler for `seed` (drawn from the environment's
        generator when None)."""
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(2**31))
        self.scene.reset(seed=seed)
        return self._observation(), {"is_success": False, "task_done": False}

    def step(self, action: np.ndarray
             ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        action = np.asarray(action).reshape(-1)  # its dtype kept, as gym-aloha's step does
        if action.shape != (len(JOINT_NAMES),) or not np.isfinite(action).all():
            raise ValueError(f"an ALOHA action is {len(JOINT_NAMES)} finite joint targets, "
                             f"got {action.shape} {action}")
        reward = self.scene.step(action)
        success = reward >= MAX_REWARD
        info = {"is_success": success, "task_done": self.scene.task_done(reward)}
        return (self._observation(), reward, success and self.terminate_on_success, False,
                info)

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            return None
        if (self.obs_type == "pixels_agent_pos" and self.render_camera == "top"
                and self.render_size == CAMERA_FRAME):
            return self._top.copy()  # the observation's frame: not rendered twice
        return self.scene.render(self.render_camera, *self.render_size)


__all__ = ["AlohaEnv", "RenderingUnavailable"]
