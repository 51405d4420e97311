"""Record scripted demonstrations as ACT's data collection does.

For each seed the expert runs in the end-effector (mocap) scene; its joint trajectory, with
each gripper's joint replaced by the gripper command, is then replayed as joint targets in
the joint-space scene from the same object poses. What is recorded is the replay: at step
t the observed joint positions and object poses (and camera frames), and the joint target
sent (the action). So the observations and actions are those a policy sees and sends in
the joint-space scene, which is the one the evaluation runs. An episode whose replay never
reaches the task's top reward is a failure and is not kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from embodichain_models.policies.aloha.expert import EXPERTS
from embodichain_models.policies.aloha.scene import Scene
from embodichain_models.policies.aloha.tasks import (
    CAMERA_FRAME,
    EPISODE_STEPS,
    MAX_REWARD,
    AlohaTask,
)


@dataclass
class Demonstration:
    """One replayed episode: float32 `state [T, 14]`, `env_state [T, 7n]`, `action [T, 14]`,
    the object poses it started from, and whether it succeeded."""

    seed: int
    poses: np.ndarray
    state: np.ndarray
    env_state: np.ndarray
    action: np.ndarray
    success: bool
    rewards: np.ndarray = field(repr=False)
    targets: np.ndarray = field(repr=False)
    """The joint targets sent (float64; `action` is their float32 record)."""


def _target(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The end-effector scene's joint positions, each gripper's as its normalised command."""
    from gym_aloha.constants import normalize_puppet_gripper_position

    target = observation["qpos"].copy()
    ctrl = observation["gripper_ctrl"]
    target[6] = normalize_puppet_gripper_position(ctrl[0])
    target[13] = normalize_puppet_gripper_position(ctrl[2])
    return target


def expert_joint_trajectory(ee: Scene, seed: int, steps: int) -> np.ndarray:
    """The expert's run in the end-effector scene as `steps` joint targets `[steps, 14]`."""
    ee.reset(seed=seed)
    first = ee.observation
    expert = EXPERTS[ee.task.name](first["mocap_pose_left"], first["mocap_pose_right"],
                                   first["env_state"])
    targets = [_target(first)]
    for t in range(steps - 1):
        ee.step(expert(t))
        targets.append(_target(ee.observation))
    return np.stack(targets)


def replay(scene: Scene, poses: np.ndarray, actions: np.ndarray, seed: int,
           stop_at: int | None = None) -> Demonstration:
    """Replay joint targets in the joint-space scene from `poses`; `stop_at` ends early at
    the first step reaching that reward (tests)."""
    scene.reset(poses=poses)
    states, env_states, rewards = [], [], []
    for action in actions:
        states.append(scene.qpos.astype(np.float32))
        env_states.append(scene.env_state.astype(np.float32))
        rewards.append(scene.step(action))
        if stop_at is not None and rewards[-1] >= stop_at:
            break
    n = len(states)
    return Demonstration(seed, poses, np.stack(states), np.stack(env_states),
                         actions[:n].astype(np.float32), max(rewards) >= MAX_REWARD,
                         np.asarray(rewards), actions[:n])


class Recorder:
    """Runs the expert of `task` seed after seed (both scenes built once)."""

    def __init__(self, task: AlohaTask, steps: int = EPISODE_STEPS) -> None:
        self.task, self.steps = task, steps
        self.ee = Scene(task, end_effector=True)
        self.scene = Scene(task)

    def demonstrate(self, seed: int, stop_at_success: bool = False) -> Demonstration:
        from embodichain_models.policies.aloha.scene import sample_poses

        actions = expert_joint_trajectory(self.ee, seed, self.steps)
        return replay(self.scene, sample_poses(self.task, seed), actions, seed,
                      MAX_REWARD if stop_at_success else None)

    def frames(self, demo: Demonstration, camera: str, size: tuple[int, int]) -> np.ndarray:
        """The camera's frames of `demo`, uint8 `[T, H, W, 3]`, from a second replay (the
        physics is deterministic: its states are checked to be the recorded ones)."""
        self.scene.reset(poses=demo.poses)
        frames = []
        for t, action in enumerate(demo.targets):
            if not np.array_equal(self.scene.qpos.astype(np.float32), demo.state[t]):
                raise RuntimeError(f"seed {demo.seed}: the replay for camera {camera!r} "
                                   f"left the recorded states at step {t}")
            frames.append(self.render(camera, size))
            self.scene.step(action)
        return np.stack(frames)

    def render(self, camera: str, size: tuple[int, int]) -> np.ndarray:
        """The camera's frame as gym-aloha renders it (480x640), averaged down to `size`."""
        return downsample(self.scene.render(camera, *CAMERA_FRAME), size)

    def successes(self, count: int, first_seed: int, max_attempts: int,
                  log: Callable | None = None) -> tuple[list[Demonstration], int, float]:
        """The first `count` successful demonstrations from seeds `first_seed`, ... (at most
        `max_attempts` tried); returns them, the attempts and the seconds per attempt."""
        kept, attempts, start = [], 0, time.perf_counter()
        while len(kept) < count and attempts < max_attempts:
            demo = self.demonstrate(first_seed + attempts)
            attempts += 1
            if demo.success:
                kept.append(demo)
            if log is not None:
                log(demo, len(kept), attempts)
        return kept, attempts, (time.perf_counter() - start) / max(attempts, 1)


def downsample(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 `[H, W, 3]` averaged over blocks of H/h x W/w pixels (both whole) to `size`,
    rounded: what the policy's `frames_in` computes of the same frame, to the uint8 step."""
    height, width = frame.shape[:2]
    fy, fx = height // size[0], width // size[1]
    if fy * size[0] != height or fx * size[1] != width:
        raise ValueError(f"{height}x{width} frames cannot be averaged to "
                         f"{size[0]}x{size[1]}: a whole fraction is needed")
    if (fy, fx) == (1, 1):
        return frame
    blocks = frame.reshape(size[0], fy, size[1], fx, 3).astype(np.float32)
    return np.rint(blocks.mean((1, 3))).astype(np.uint8)


class LazyEpisodes(Sequence):
    """The demonstrations as the dataset writer's episodes, camera frames rendered only
    when the writer reaches an episode's file, so memory holds one file's frames."""

    def __init__(self, recorder: Recorder, demos: list[Demonstration], cameras: Sequence[str],
                 size: tuple[int, int]) -> None:
        self.recorder, self.demos, self.cameras, self.size = recorder, demos, cameras, size

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return _Episode(self, self.demos[i])

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))


class _Episode:
    """An `EpisodeData` whose camera frames are rendered on first use."""

    def __init__(self, owner: LazyEpisodes, demo: Demonstration) -> None:
        self.owner, self.demo = owner, demo
        self.task = owner.recorder.task.text

    @property
    def length(self) -> int:
        return len(self.demo.action)

    @cached_property
    def values(self) -> dict[str, np.ndarray]:
        d, o = self.demo, self.owner
        values = {"observation.state": d.state, "observation.environment_state": d.env_state,
                  "action": d.action}
        for camera in o.cameras:
            values[f"observation.images.{camera}"] = o.recorder.frames(d, camera, o.size)
        return values
