"""gym-aloha's MuJoCo scenes, stepped without rendering.

gym-aloha's tasks render three 480x640 cameras in every observation (about 0.1 s a frame
on software OpenGL, while the physics of a control step takes under a millisecond). The
tasks here are gym-aloha's own (same scenes, physics, actions and rewards) with an
observation of the joint positions and the objects' poses only; a camera is rendered only
when asked for (`Scene.render`). Object poses come from the scene's `reset(seed)`, drawn
by gym-aloha's own samplers, so seed s places the objects as `gym_aloha`'s environments
reset with seed s do.

Needs the `[sim]` extra (gym-aloha, dm_control, MuJoCo); `require_sim()` says so by name.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import numpy as np

from embodichain.learning.sl import UsageError
from embodichain_models.envs.aloha.tasks import MAX_REWARD, AlohaTask, task_named

SIM_EXTRA = "pip install 'embodichain-models[sim]'"
WELD_SOLIMP = (0.9, 0.95, 0.001)
"""Impedance of the end-effector scene's gripper welds (MuJoCo's default)."""


class SimUnavailable(UsageError, ImportError):
    """The simulator's packages are not installed (exit 2, naming the extra)."""


class RenderingUnavailable(UsageError, RuntimeError):
    """A camera was asked for where MuJoCo cannot render (exit 2, naming the backend)."""


def gl_backend() -> str:
    """The OpenGL backend MuJoCo renders with: `MUJOCO_GL`, set to `egl` (headless, GPU or
    Mesa) on a machine without a display before dm_control first reads it."""
    if "DISPLAY" not in os.environ and "dm_control" not in sys.modules:
        os.environ.setdefault("MUJOCO_GL", "egl")
    return os.environ.get("MUJOCO_GL", "(unset: glfw, then egl, then osmesa)")


GL_CHOICES = ("MUJOCO_GL=egl (headless: a GPU driver or Mesa's EGL), osmesa (software, "
              "needs libOSMesa) or glfw (needs a display)")


def require_sim() -> None:
    """Import the simulator's packages, or refuse naming the extra that installs them (or
    the OpenGL backend that dm_control fails to load)."""
    backend = gl_backend()
    for module in ("gymnasium", "dm_control.mujoco", "dm_control.rl.control", "gym_aloha"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise SimUnavailable(
                f"the ALOHA simulator needs gym-aloha, dm_control and MuJoCo ({exc}): "
                f"{SIM_EXTRA}") from None
        except Exception as exc:  # noqa: BLE001 - dm_control loads OpenGL at import
            raise RenderingUnavailable(
                f"dm_control cannot load MuJoCo's OpenGL backend MUJOCO_GL={backend} "
                f"({type(exc).__name__}: {exc}). Set {GL_CHOICES}, or MUJOCO_GL=disable "
                "to simulate without cameras") from None


def _task_classes() -> dict[str, tuple[type, type]]:
    """Per task: the joint-space and the end-effector task class, observing without
    rendering and placing the objects from `poses` rather than a global."""
    from gym_aloha.constants import START_ARM_POSE
    from gym_aloha.tasks import sim, sim_end_effector

    def joint_task(base: type) -> type:
        class JointTask(base):
            poses: np.ndarray

            def initialize_episode(self, physics: Any) -> None:
                # gym-aloha's reset, with the poses of this scene's reset(seed).
                physics.named.data.qpos[:16] = START_ARM_POSE
                np.copyto(physics.data.ctrl, START_ARM_POSE)
                physics.data.qpos[16:] = self.poses
                sim.BimanualViperXTask.initialize_episode(self, physics)

            def get_observation(self, physics: Any) -> dict[str, np.ndarray]:
                return {"qpos": self.get_qpos(physics), "env_state": self.get_env_state(physics)}
        return JointTask

    def ee_task(base: type) -> type:
        class EndEffectorTask(base):
            poses: np.ndarray

            def initialize_episode(self, physics: Any) -> None:
                self.initialize_robots(physics)
                physics.data.qpos[16:] = self.poses
                sim_end_effector.BimanualViperXEndEffectorTask.initialize_episode(self, physics)

            def get_observation(self, physics: Any) -> dict[str, np.ndarray]:
                return {"qpos": self.get_qpos(physics), "env_state": self.get_env_state(physics),
                        "mocap_pose_left": np.concatenate([physics.data.mocap_pos[0],
                                                           physics.data.mocap_quat[0]]),
                        "mocap_pose_right": np.concatenate([physics.data.mocap_pos[1],
                                                            physics.data.mocap_quat[1]]),
                        "gripper_ctrl": physics.data.ctrl.copy()}
        return EndEffectorTask

    return {"transfer_cube": (joint_task(sim.TransferCubeTask),
                              ee_task(sim_end_effector.TransferCubeEndEffectorTask)),
            "insertion": (joint_task(sim.InsertionTask),
                          ee_task(sim_end_effector.InsertionEndEffectorTask))}


def sample_poses(task: AlohaTask, seed: int) -> np.ndarray:
    """The objects' initial poses for `seed`, by gym-aloha's samplers (float64 `[7 * n]`)."""
    from gym_aloha.utils import sample_box_pose, sample_insertion_pose

    if task.name == "transfer_cube":
        return sample_box_pose(seed)
    return np.concatenate(sample_insertion_pose(seed))


class Scene:
    """One ALOHA scene: `reset(seed)`, `step(action) -> reward`, `qpos`, `env_state`,
    `render(camera, height, width)`. `end_effector` picks the mocap scene (actions: each
    arm's gripper pose xyz + quaternion and its gripper opening, 16 values) instead of the
    joint-space one (actions: 14 joint targets)."""

    def __init__(self, task: str | AlohaTask, end_effector: bool = False) -> None:
        require_sim()
        from dm_control import mujoco
        from dm_control.rl import control
        from gym_aloha.constants import ASSETS_DIR, DT

        self.task = task if isinstance(task, AlohaTask) else task_named(task)
        xml = self.task.ee_scene if end_effector else self.task.scene
        self.physics = mujoco.Physics.from_xml_path(str(ASSETS_DIR / xml))
        if end_effector:
            # The welds holding each gripper to its mocap body are written soft (solimp
            # 0.25 0.25): under MuJoCo 3 they no longer hold the gripper's orientation, the
            # gripper reaches the cube sideways and the expert fails (ACT pins MuJoCo
            # 2.3.7). With MuJoCo's default impedance the expert succeeds as published.
            # Only the expert's scene: the policy's joint-space scene is gym-aloha's own.
            self.physics.model.eq_solimp[:, :3] = WELD_SOLIMP
        self._task = _task_classes()[self.task.name][1 if end_effector else 0]()
        self._env = control.Environment(self.physics, self._task, float("inf"),
                                        control_timestep=DT, flat_observation=False)
        self.observation: dict[str, np.ndarray] = {}
        self.cameras = [self.physics.model.id2name(i, "camera")
                        for i in range(self.physics.model.ncam)]

    def reset(self, seed: int | None = None, poses: np.ndarray | None = None) -> None:
        """Start an episode with the objects at `poses`, or where `seed` places them."""
        if poses is None:
            if seed is None:
                raise ValueError("reset needs a seed or the objects' poses")
            poses = sample_poses(self.task, seed)
        self._task.poses = np.asarray(poses, dtype=np.float64)
        self.observation = dict(self._env.reset().observation)

    def step(self, action: np.ndarray) -> float:
        """One control step; the action keeps its float dtype, as gym-aloha's step passes
        it: the task un-normalises the grippers in that dtype (float32 and float64 targets
        give different trajectories)."""
        action = np.asarray(action)
        if action.dtype.kind != "f":
            action = action.astype(np.float64)
        timestep = self._env.step(action)
        self.observation = dict(timestep.observation)
        return float(timestep.reward)

    @property
    def qpos(self) -> np.ndarray:
        """The 14 joint positions (grippers normalised, 0 closed, 1 open)."""
        return self.observation["qpos"]

    @property
    def env_state(self) -> np.ndarray:
        """The objects' poses (xyz, quaternion wxyz each)."""
        return self.observation["env_state"]

    def task_done(self, reward: float) -> bool:
        """Whether the task is done in the scene's present state, `reward` its last step's
        (R-ALOHA-2, R-TRUST-1): gym-aloha's top reward at that step, the field's own
        condition (transfer-cube: the cube touches the left gripper's finger and not the
        table; insertion: the peg touches the pin, about 20 mm inside the socket). No
        looser rule counts: a peg that sprang back off the pin and rests a few millimetres
        short of it is not done, nor a cube dropped after the left finger touched it."""
        return reward >= MAX_REWARD

    def check_camera(self, camera: str) -> None:
        """Refuse an unknown camera, or one MuJoCo cannot render here (naming the backend)."""
        if camera not in self.cameras:
            raise UsageError(f"unknown camera {camera!r} of the ALOHA scene: choose one of "
                             f"{', '.join(self.cameras)}")
        try:
            self.physics.render(height=8, width=8, camera_id=camera)
        except Exception as exc:  # noqa: BLE001 - every backend fails in its own way
            raise RenderingUnavailable(
                f"cannot render camera {camera!r}: MuJoCo's OpenGL backend MUJOCO_GL="
                f"{gl_backend()} failed ({type(exc).__name__}: {exc}). Set {GL_CHOICES}, "
                "or use no camera") from None

    def render(self, camera: str, height: int, width: int) -> np.ndarray:
        """The camera's rgb frame, uint8 `[height, width, 3]`."""
        return np.ascontiguousarray(self.physics.render(height=height, width=width,
                                                        camera_id=camera))
