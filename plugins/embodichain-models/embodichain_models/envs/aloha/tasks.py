"""The ALOHA tasks by name: what each scene holds, its text and its privileged state.

Torch-free and simulator-free (recipes and command lines check task names without the
`[sim]` extra). The scenes, their physics and rewards are gym-aloha's (`scene.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from embodichain.learning.sl import UsageError

FPS = 50
"""Control steps per second (gym-aloha's DT = 0.02 s: 10 physics steps of 2 ms each)."""
EPISODE_STEPS = 400
"""Steps of a demonstration and of an evaluation episode (ACT's 8 s)."""
MAX_REWARD = 4
"""gym-aloha's top reward for both tasks: success."""
JOINT_NAMES = [f"{side}_{joint}" for side in ("left", "right") for joint in
               ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
                "gripper")]
"""The 14 joint positions of `observation.state` and `action` (grippers normalised:
0 closed, 1 open)."""
CAMERA_FRAME = (480, 640)
"""(height, width) of gym-aloha's camera frames (its observation's `pixels`): what a camera
policy takes, and what `prepare` renders before averaging down to the stored size."""
EVAL_SEED = 100_000
"""Evaluation episodes are reset with seeds from here up; demonstrations use seeds below."""
INFO_FILE = "meta/aloha.json"
"""`prepare`'s report in a dataset: the task, the demonstrations' seeds (an evaluation on
them is refused), the expert's success rate."""


def _pose_names(body: str) -> list[str]:
    return [f"{body}_{c}" for c in ("x", "y", "z", "qw", "qx", "qy", "qz")]


@dataclass(frozen=True)
class AlohaTask:
    name: str
    text: str
    """The task's text in the dataset (lerobot's aloha_sim datasets use the same)."""
    scene: str
    """gym-aloha's joint-space scene (the policy's)."""
    ee_scene: str
    """gym-aloha's end-effector (mocap) scene (the scripted expert's)."""
    objects: tuple[str, ...]
    """The free bodies whose poses form `observation.environment_state`."""

    @property
    def env_state_names(self) -> list[str]:
        return [n for body in self.objects for n in _pose_names(body)]

    @property
    def gym_id(self) -> str:
        return f"embodichain_models/Aloha{self.name.title().replace('_', '')}-v0"

    @property
    def gym_aloha_id(self) -> str:
        """gym-aloha's own registration of the task (`import gym_aloha`)."""
        return f"gym_aloha/Aloha{self.name.title().replace('_', '')}-v0"


TASKS = {
    "transfer_cube": AlohaTask(
        "transfer_cube", "Pick up the cube with the right arm and transfer it to the left arm.",
        "bimanual_viperx_transfer_cube.xml", "bimanual_viperx_end_effector_transfer_cube.xml",
        ("cube",)),
    "insertion": AlohaTask(
        "insertion", "Insert the peg into the socket.",
        "bimanual_viperx_insertion.xml", "bimanual_viperx_end_effector_insertion.xml",
        ("peg", "socket")),
}


def task_named(name: str) -> AlohaTask:
    """The task called `name`; an unknown name is refused naming the known ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise UnknownTask(f"unknown ALOHA task {name!r}: choose one of "
                          f"{', '.join(TASKS)}") from None


class UnknownTask(UsageError, ValueError):
    """A task name that is not one of `TASKS` (exit 2)."""
