"""The ALOHA ACT recipe's own sections (no torch, no simulator at import: registered in
`embodichain.sl_schemas`, so `validate-config` stays fast). The closed-loop judge is the
framework's `evaluation:` section (R-EVAL-1)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from embodichain.learning.sl import Section
from embodichain_models.envs.aloha.tasks import TASKS
from embodichain_models.policies.demonstrations import DemonstrationData, dataset_root

PREPARE_COMMAND = "python -m embodichain_models.data.aloha.prepare"
CAMERA_SIZE = "120x160"  # the frame size the camera recipes record (docs/aloha.md)


def prepare_command(root: Path, fields: Mapping[str, Any]) -> str:
    """The command that records what a recipe with these `data` fields reads at `root`: its
    task, and its cameras at the camera recipes' size (a state recipe records none)."""
    task = fields.get("task") or "TASK"  # absent: data.task is itself refused
    cameras = fields.get("cameras")
    seen = f" --cameras {','.join(cameras)} --size {CAMERA_SIZE}" if cameras else ""
    return f"{PREPARE_COMMAND} --task {task} --episodes 50{seen} {shlex.quote(str(root))}"


DatasetRoot = dataset_root(prepare_command)


def known_task(name: str) -> str:
    """`name` if it is an ALOHA task (ValueError naming the known ones otherwise)."""
    if name not in TASKS:
        raise ValueError(f"unknown ALOHA task {name!r}: choose one of {', '.join(TASKS)}")
    return name


class ModelSection(Section):
    hidden: PositiveInt = 128
    """Width of every token (ACT: 512)."""
    heads: PositiveInt = 4
    encoder_layers: PositiveInt = 2
    """Transformer encoder layers over the observation tokens (ACT: 4)."""
    decoder_layers: PositiveInt = 1
    """Decoder layers (ACT's code uses the first of its 7; lerobot: 1)."""
    feedforward: PositiveInt = 512
    """Width of the feed-forward blocks (ACT: 3200)."""
    dropout: float = Field(default=0.1, ge=0, lt=1)
    cvae: bool = False
    """ACT's conditional VAE: a style latent inferred from the demonstrated chunk in
    training (zero at execution), with `kl_weight` x its KL divergence in the loss."""
    latent_dim: PositiveInt = 32
    kl_weight: float = Field(default=10.0, ge=0)
    channels: PositiveInt = 32
    """Width of the camera backbone (a ResNet-18 layout with GroupNorm, from scratch): its
    stages have 1, 2, 4, 8 times it (ResNet-18: 64). Only with data.cameras."""
    image_shift: NonNegativeInt = 0
    """Random shift augmentation of the camera images in training (DrQ's, Diffusion
    Policy's random crop): up to this many pixels each way at the backbone's resolution,
    edges replicated; none when acting."""

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSection:
        if self.hidden % self.heads:
            raise ValueError(f"model.hidden ({self.hidden}) must be a multiple of "
                             f"model.heads ({self.heads})")
        return self


class DataSection(DemonstrationData):
    # `root` comes after `task` and `cameras`: a missing dataset's hint records them.
    task: Annotated[str, AfterValidator(known_task)] = "transfer_cube"
    """The task the dataset shows (checked against its task text) and the evaluation runs."""
    chunk: PositiveInt = 50
    """Actions predicted per step (ACT: 100)."""
    cameras: list[str] = Field(default_factory=list)
    """Cameras the policy sees (`observation.images.<camera>` of the dataset): the policy
    then reads the joint positions and these cameras only, as gym-aloha's
    `pixels_agent_pos` (never the objects' poses); none: privileged state (joint positions
    and object poses). The backbone sees the dataset's frame size; the policy takes the
    camera's 480x640 frames and averages them down to it."""
    root: DatasetRoot
    """The LeRobot v3.0 dataset written by the prepare command."""


class ExecutionSection(Section):
    """How chunks become actions in closed loop: exactly one of the two."""

    temporal_ensemble: PositiveFloat | None = 0.01
    """ACT's temporal ensembling: every step a new chunk; the action averages all
    predictions for the step, weighted exp(-m i), i = 0 the oldest. Its m."""
    horizon: PositiveInt | None = None
    """Or: execute the first `horizon` actions of a chunk, then take a new one."""

    @model_validator(mode="before")
    @classmethod
    def _one(cls, values: object) -> object:
        if isinstance(values, dict) and values.get("horizon") is not None:
            values = {"temporal_ensemble": None, **values}
        return values

    @model_validator(mode="after")
    def _exactly_one(self) -> ExecutionSection:
        if (self.temporal_ensemble is None) == (self.horizon is None):
            raise ValueError("execution: give temporal_ensemble (m) or horizon (steps), "
                             "not both")
        return self


class ActConfig(BaseModel):
    """Recipe-owned sections of the ALOHA ACT recipe."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    execution: ExecutionSection = Field(default_factory=ExecutionSection)
