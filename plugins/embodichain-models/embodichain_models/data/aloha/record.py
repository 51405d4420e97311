"""Record scripted demonstrations as ACT's data collection does.

For each seed the expert runs in the end-effector (mocap) scene, and its joint positions,
each gripper's replaced by the gripper command, are sent as joint targets to the
joint-space scene from the same object poses: the target of step t is the end-effector
scene's state after t steps, as ACT's `record_sim_episodes.py` replays `joint_traj` (the
two scenes step side by side; the joint-space scene never acts back on the expert). What
is recorded is the joint-space scene: at step t the observed joint positions and object
poses (and camera frames), and the joint target sent (the action), so observations and
actions are those a policy sees and sends in the scene the evaluation runs.

Two verdicts per episode (R-ALOHA-2): `success`, the field's (the top reward reached at
some step: ACT's and gym-aloha's), and `finished`, the task still done at the last step
(`Scene.task_done`). Only finished episodes are kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from embodichain_models.data.aloha.expert import EXPERTS
from embodichain_models.envs.aloha.scene import Scene
from embodichain_models.envs.aloha.tasks import (
    CAMERA_FRAME,
    EPISODE_STEPS,
    MAX_REWARD,
    AlohaTask,
)


@dataclass
class Demonstration:
    """One recorded episode: float32 `state [T, 14]`, `env_state [T, 7n]`, `action [T, 14]`,
    the object poses it started from, whether the top reward was reached (`success`) and
    whether the task was still done at its last step (`finished`)."""

    seed: int
    poses: np.ndarray
    state: np.ndarray
    env_state: np.ndarray
    action: np.ndarray
    success: bool
    rewards: np.ndarray = field(repr=False)
    targets: np.ndarray = field(repr=False)
    """The joint targets sent (float64; `action` is their float32 record)."""
    finished: bool = False


def _target(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The end-effector scene's joint positions, each gripper's as its normalised command."""
    from gym_aloha.constants import normalize_puppet_gripper_position

    target = observation["qpos"].copy()
    ctrl = observation["gripper_ctrl"]
    target[6] = normalize_puppet_gripper_position(ctrl[0])
    target[13] = normalize_puppet_gripper_position(ctrl[2])
    return target


class Recorder:
    """Runs the expert of `task` seed after seed (both scenes built once)."""

    def __init__(self, task: AlohaTask, steps: int = EPISODE_STEPS) -> None:
        self.task, self.steps = task, steps
        self.ee = Scene(task, end_effector=True)
        self.scene = Scene(task)

    def demonstrate(self, seed: int, stop_at_success: bool = False) -> Demonstration:
        """The expert's episode of `seed`; `stop_at_success` ends it at the first step
        reaching the top reward (tests)."""
        from embodichain_models.envs.aloha.scene import sample_poses

        ee, scene = self.ee, self.scene
        poses = sample_poses(self.task, seed)
        ee.reset(poses=poses)
        scene.reset(poses=poses)
        first = ee.observation
        expert = EXPERTS[self.task.name](first["mocap_pose_left"], first["mocap_pose_right"],
                                         first["env_state"])
        states, env_states, rewards, targets = [], [], [], []
        for t in range(self.steps):
            target = _target(ee.observation)
            states.append(scene.qpos.astype(np.float32))
            env_states.append(scene.env_state.astype(np.float32))
            targets.append(target)
            rewards.append(scene.step(target))
            if stop_at_success and rewards[-1] >= MAX_REWARD:
                break
            if t + 1 < self.steps:
                ee.step(expert(t))
        actions = np.stack(targets)
        return Demonstration(seed, poses, np.stack(states), np.stack(env_states),
                             actions.astype(np.float32), max(rewards) >= MAX_REWARD,
                             np.asarray(rewards), actions,
                             finished=scene.task_done(rewards[-1]))

    def frames(self, demo: Demonstration, camera: str, size: tuple[int, int],
               rendered: Callable[[], None] | None = None) -> np.ndarray:
        """The camera's frames of `demo`, uint8 `[T, H, W, 3]`, from a replay of its joint
        targets (the physics is deterministic: its states are checked to be the recorded
        ones); `rendered()` is called after each frame (the progress)."""
        self.scene.reset(poses=demo.poses)
        frames = []
        for t, action in enumerate(demo.targets):
            if not np.array_equal(self.scene.qpos.astype(np.float32), demo.state[t]):
                raise RuntimeError(f"seed {demo.seed}: the replay for camera {camera!r} "
                                   f"left the recorded states at step {t}")
            frames.append(self.render(camera, size))
            if rendered is not None:
                rendered()
            self.scene.step(action)
        return np.stack(frames)

    def render(self, camera: str, size: tuple[int, int]) -> np.ndarray:
        """The camera's frame as gym-aloha renders it (480x640), averaged down to `size`."""
        return downsample(self.scene.render(camera, *CAMERA_FRAME), size)

    def finished(self, count: int, first_seed: int, max_attempts: int,
                 log: Callable | None = None) -> tuple[list[Demonstration], list[Demonstration],
                                                      float]:
        """The first `count` finished demonstrations from seeds `first_seed`, ... (at most
        `max_attempts` tried); returns them, every attempt, and the seconds per attempt."""
        kept, tried, start = [], [], time.perf_counter()
        while len(kept) < count and len(tried) < max_attempts:
            demo = self.demonstrate(first_seed + len(tried))
            tried.append(demo)
            if demo.finished:
                kept.append(demo)
            if log is not None:
                log(demo, len(kept), len(tried))
        return kept, tried, (time.perf_counter() - start) / max(len(tried), 1)


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
    when the writer reaches an episode's file, so memory holds one file's frames;
    `rendered()` is called after each frame. With `workers` > 1 the frames are rendered
    in that many processes (the writer reads the episodes in order, so each process works
    one episode ahead: memory holds up to `workers` more episodes' frames); use it as a
    context manager then, which stops the processes."""

    def __init__(self, recorder: Recorder, demos: list[Demonstration], cameras: Sequence[str],
                 size: tuple[int, int], rendered: Callable[[], None] | None = None,
                 workers: int = 1) -> None:
        self.recorder, self.demos, self.cameras, self.size = recorder, demos, cameras, size
        self.rendered = rendered
        self.pool = _FramePool(recorder.task.name, demos, cameras, size, workers) \
            if workers > 1 and cameras else None

    def __len__(self) -> int:
        return len(self.demos)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return _Episode(self, i)

    def __iter__(self) -> Iterator:
        return (self[i] for i in range(len(self)))

    def __enter__(self) -> LazyEpisodes:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.close()

    def frames(self, index: int) -> dict[str, np.ndarray]:
        """Each camera's frames of demonstration `index`."""
        demo = self.demos[index]
        if self.pool is None:
            return {camera: self.recorder.frames(demo, camera, self.size, self.rendered)
                    for camera in self.cameras}
        frames = self.pool.frames(index)
        if self.rendered is not None:
            for _ in range(sum(len(f) for f in frames.values())):
                self.rendered()
        return frames


class _FramePool:
    """Renders demonstrations' camera frames in worker processes, each with its own scenes,
    the next `workers` episodes submitted ahead of the one asked for."""

    def __init__(self, task: str, demos: list[Demonstration], cameras: Sequence[str],
                 size: tuple[int, int], workers: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.demos, self.cameras, self.size, self.workers = demos, list(cameras), size, workers
        # Spawned, not forked: a fork would inherit this process's MuJoCo and OpenGL state.
        self.executor = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"),
                                            initializer=_start_worker, initargs=(task,))
        self.pending: dict[int, Future] = {}
        self.submitted = 0

    def frames(self, index: int) -> dict[str, np.ndarray]:
        if index not in self.pending:  # asked out of order: rendered on its own
            self.pending[index] = self._submit(index)
        while self.submitted < min(index + 1 + self.workers, len(self.demos)):
            if self.submitted not in self.pending:
                self.pending[self.submitted] = self._submit(self.submitted)
            self.submitted += 1
        return self.pending.pop(index).result()

    def _submit(self, index: int) -> Future:
        return self.executor.submit(_render_in_worker, self.demos[index], self.cameras,
                                    self.size)

    def close(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)


_worker_recorder: Recorder | None = None


def _start_worker(task: str) -> None:
    from embodichain_models.envs.aloha.tasks import task_named

    global _worker_recorder
    _worker_recorder = Recorder(task_named(task))


def _render_in_worker(demo: Demonstration, cameras: list[str],
                      size: tuple[int, int]) -> dict[str, np.ndarray]:
    assert _worker_recorder is not None
    return {camera: _worker_recorder.frames(demo, camera, size) for camera in cameras}


class _Episode:
    """An `EpisodeData` whose camera frames are rendered on first use."""

    def __init__(self, owner: LazyEpisodes, index: int) -> None:
        self.owner, self.index, self.demo = owner, index, owner.demos[index]
        self.task = owner.recorder.task.text

    @property
    def length(self) -> int:
        return len(self.demo.action)

    @cached_property
    def values(self) -> dict[str, np.ndarray]:
        d = self.demo
        values = {"observation.state": d.state, "observation.environment_state": d.env_state,
                  "action": d.action}
        frames = self.owner.frames(self.index)
        values.update({f"observation.images.{camera}": f for camera, f in frames.items()})
        return values
