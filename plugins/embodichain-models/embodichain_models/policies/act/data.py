"""The ALOHA recipe's training source, held-out frames and statistics, with the checks that
the dataset shows the recipe's task, has the features the policy reads, and that the
evaluation runs that task."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodichain.learning.sl import DatasetSource, UnknownSeeds, UsageError, facts_from_checkpoint
from embodichain_models.data.lerobot import LeRobotFormatError, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.metadata import read_meta
from embodichain_models.envs.aloha.scene import Scene
from embodichain_models.envs.aloha.tasks import (
    CAMERA_FRAME,
    INFO_FILE,
    JOINT_NAMES,
    TASKS,
    AlohaTask,
)
from embodichain_models.policies.act.model import ACTION, ENV_STATE, IMAGE_PREFIX, STATE
from embodichain_models.policies.act.schema import ActConfig


@dataclass
class ActData:
    source: DatasetSource
    held_out: LeRobotFrames | None
    stats: dict[str, dict[str, np.ndarray]]
    fps: int
    env_dim: int
    image_sizes: dict[str, tuple[int, int]]
    seeds: list[int] | UnknownSeeds
    """The environment seeds of the demonstrations (`meta/aloha.json`; unknown without it)."""


def check_task(task: AlohaTask, tasks: list[str], root: Any) -> None:
    """Refuse a dataset recorded for another task (its task text names it)."""
    if task.text not in tasks:
        known = {t.text: name for name, t in TASKS.items()}
        shown = ", ".join(f"{known[t]!r} ({t!r})" if t in known else repr(t) for t in tasks)
        raise UsageError(f"data.root {str(root)!r} holds episodes of task {shown}, not "
                         f"data.task {task.name!r} ({task.text!r}): record one with "
                         f"`python -m embodichain_models.data.aloha.prepare --task "
                         f"{task.name} ...` or set data.task")


def check_evaluation(config: Any, task: AlohaTask) -> None:
    """The evaluation section, when it runs an ALOHA environment (ours or gym-aloha's
    registered one), runs data.task and observes what the policy reads: a state policy our
    environment's state, a camera policy `obs_type: pixels_agent_pos` (the top camera)."""
    evaluation = getattr(config, "evaluation", None)
    if evaluation is None:
        return
    env = evaluation.env
    named = env.kwargs.get("task")
    ours = {t.gym_id: t.name for t in TASKS.values()}
    theirs = {t.gym_aloha_id: t.name for t in TASKS.values()}
    by_id = {**ours, **theirs}.get(env.id or "")
    for where, name in (("evaluation.env.kwargs.task", named), ("evaluation.env.id", by_id)):
        if name is not None and name != task.name:
            raise UsageError(f"{where} runs task {name!r}, but data.task is {task.name!r}: "
                             "the policy would be judged on a task it never saw")
    if not (by_id or named):
        return
    wanted = config.data.cameras
    obs_type = env.kwargs.get("obs_type", "pixels" if env.id in theirs else "state")
    if wanted:
        if obs_type != "pixels_agent_pos" or sorted(wanted) != ["top"]:
            raise UsageError(f"data.cameras {wanted}: a camera policy sees gym-aloha's "
                             "pixels_agent_pos (the top camera and the joint positions): "
                             "set data.cameras: [top] and evaluation.env.kwargs.obs_type: "
                             f"pixels_agent_pos (it is {obs_type!r})")
        cameras = ["top"]
    else:
        if obs_type != "state" or env.kwargs.get("cameras"):
            raise UsageError(f"evaluation.env observes {obs_type!r}"
                             f"{' with cameras' if env.kwargs.get('cameras') else ''}, but "
                             "the policy reads state only (data.cameras is empty): drop "
                             "evaluation.env.kwargs.obs_type/cameras or record a camera")
        cameras = []
    filmed = [env.kwargs.get("render_camera", "top")] if evaluation.videos else []
    if cameras or filmed:  # rendering must work here, not fail every episode later
        scene = Scene(task)
        for camera in [*cameras, *filmed]:
            scene.check_camera(camera)


def act_data(config: ActConfig, *, chunk: int | None = None, history: int = 1) -> ActData:
    """The recipe's data: each example the action chunk from its frame on (`chunk`, default
    `data.chunk`) and, with `history` > 1, the observations (joints, object poses, camera
    frames) of its frame and the `history`-1 before it, `[history, ...]` oldest first (an
    episode's first frame repeated before its start), decoded in the data workers."""
    data = config.data
    chunk = data.chunk if chunk is None else chunk
    task = TASKS[data.task]
    meta = read_meta(data.root)
    check_task(task, meta.tasks, data.root)
    features = meta.features
    wanted = {STATE: [len(JOINT_NAMES)], ACTION: [len(JOINT_NAMES)]}
    if not data.cameras:  # privileged state: the objects' poses too
        wanted[ENV_STATE] = [len(task.env_state_names)]
    for key, shape in wanted.items():
        if key not in features or list(features[key]["shape"]) != shape:
            found = features[key]["shape"] if key in features else "absent"
            raise UsageError(f"data.root {str(data.root)!r}: feature {key!r} should have "
                             f"shape {shape} for {task.name}, found {found}")
    sizes = {}
    for camera in data.cameras:
        key = IMAGE_PREFIX + camera
        if key not in features:
            have = [k[len(IMAGE_PREFIX):] for k in features if k.startswith(IMAGE_PREFIX)]
            raise UsageError(f"data.cameras: {str(data.root)!r} has no camera {camera!r} "
                             f"(it has: {', '.join(have) or 'none'}); record one with "
                             "prepare --cameras")
        height, width = (int(v) for v in features[key]["shape"][:2])
        if CAMERA_FRAME[0] % height or CAMERA_FRAME[1] % width:
            raise UsageError(f"data.cameras: {str(data.root)!r} holds {camera!r} frames of "
                             f"{height}x{width}, not a whole fraction of the camera's "
                             f"{CAMERA_FRAME[0]}x{CAMERA_FRAME[1]} (the policy averages "
                             "the camera's frames down to the dataset's): record with "
                             "prepare --size 480x640, 240x320 or 120x160")
        sizes[camera] = (height, width)
    observed = [key for key in wanted if key != ACTION] + [IMAGE_PREFIX + c
                                                           for c in data.cameras]
    past = [(i - history + 1) / meta.fps for i in range(history)]
    options = {"delta_timestamps": {ACTION: [i / meta.fps for i in range(chunk)],
                                    **({key: past for key in observed} if history > 1
                                       else {})},
               "features": [*wanted, *(IMAGE_PREFIX + c for c in data.cameras)]}
    indices = [e.index for e in meta.episodes]
    if len(indices) <= data.val_episodes:
        raise UsageError(f"data.root {str(data.root)!r} has {len(indices)} episodes: too few "
                         f"to hold out data.val_episodes={data.val_episodes}")
    held = indices[len(indices) - data.val_episodes:] if data.val_episodes else []
    train = indices[:len(indices) - len(held)]
    source = lerobot_source(data.root, episodes=train, identity=data.identity, **options)
    held_out = LeRobotFrames(data.root, episodes=held, **options) if held else None
    return ActData(source, held_out, meta.stats, meta.fps, len(task.env_state_names), sizes,
                   demonstration_seeds(data.root))


def dataset_facts(config: Any, statistics: tuple[str, ...], *, chunk: int | None = None,
                  history: int = 1) -> tuple[dict, ActData | None]:
    """What an ALOHA policy is built from of its dataset (recorded in every checkpoint: the
    `statistics` it normalises with, fps, the object-pose width, the frame sizes), and the
    data. A model rebuilt from a checkpoint to act reads no data (None): its facts are the
    checkpoint's. A dataset that cannot be read is refused (exit 2)."""
    facts = facts_from_checkpoint()
    if facts is not None:
        return facts, None
    try:
        data = act_data(config, chunk=chunk, history=history)
    except (LeRobotFormatError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    facts = {"stats": {key: {k: data.stats[key][k] for k in statistics}
                       for key in (STATE, ENV_STATE, ACTION)},
             "fps": data.fps, "env_dim": data.env_dim,
             "image_sizes": {c: list(s) for c, s in data.image_sizes.items()}}
    return facts, data


def demonstration_seeds(root: Any) -> list[int] | UnknownSeeds:
    """The seeds `prepare` recorded the dataset's demonstrations with (its INFO_FILE);
    unknown where the dataset has no such file (copied without it, or another recorder's)."""
    info = Path(root) / INFO_FILE
    if not info.is_file():
        return UnknownSeeds(f"{info} is missing; `prepare` writes the seeds there")
    try:
        seeds = json.loads(info.read_text()).get("seeds") or []
        return [int(s) for s in seeds]
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"{info}: not the JSON report `prepare` writes ({exc})") from None
