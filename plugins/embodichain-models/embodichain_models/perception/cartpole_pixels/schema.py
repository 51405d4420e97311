"""The cart-pole-from-pixels recipe's own sections (no torch at import: registered in
`embodichain.sl_schemas`, so `validate-config` stays fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    Strict,
)

from embodichain.learning.sl import Section

PREPARE_COMMAND = "python -m embodichain_models.perception.cartpole_pixels.prepare --out DIR"


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "file not found"
        raise ValueError(f"{what}: {str(path)!r} (create it with `{PREPARE_COMMAND}`)")
    return path


DataFile = Annotated[Path, Strict(False), AfterValidator(_existing_file)]


class ModelSection(Section):
    channels: PositiveInt = 32
    """Channels of the CNN's convolutions."""
    hidden: PositiveInt = 128


class DataSection(Section):
    train: DataFile
    """`train.h5` written by the prepare command."""
    val: DataFile
    """`val.h5`, evaluated on rank 0."""
    stack: PositiveInt = 2
    """Frames per example (the last one is the frame whose state is estimated): two or more
    let the network see the velocities."""
    shift: NonNegativeInt = 4
    """Random-shift augmentation of training frames, in pixels (0: none)."""


class ValidationSection(Section):
    max_examples: PositiveInt | None = None
    """Evaluate on the first N validation examples only (default: all)."""


class PixelsConfig(BaseModel):
    """Recipe-owned sections of the cart-pole-from-pixels recipe."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection
    validation: ValidationSection = Field(default_factory=ValidationSection)
