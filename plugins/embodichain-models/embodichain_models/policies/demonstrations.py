"""The data section the demonstration-learning policies share (ALOHA ACT, cart-pole BC): a
LeRobot v3.0 dataset, the chunk of actions predicted, the held-out episodes and what the
data's identity digests. Torch-free, as the schemas that build on it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, NonNegativeInt, PositiveInt, Strict, ValidationInfo

from embodichain.learning.sl import LOCATES_DATA, Section, only_acting


def dataset_root(prepare_command: str | Callable[[Path, Mapping[str, Any]], str]) -> Any:
    """The type of a LeRobot dataset root: a directory with meta/info.json (a missing one is
    refused naming the command that records it), marked LOCATES_DATA (a moved dataset of the
    same identity resumes). Not checked where a checkpoint's model is rebuilt only to act
    (`eval`, `export`: R-EVAL-5). `prepare_command` is the command, or makes it from the root
    and the section's fields validated before it (declare those the command needs first)."""

    def check(path: Path, info: ValidationInfo) -> Path:
        if only_acting():  # a checkpoint's model rebuilt to act (eval, export): no data read
            return path
        if not (path / "meta" / "info.json").is_file():
            what = "not found" if not path.exists() else "has no meta/info.json"
            command = (prepare_command if isinstance(prepare_command, str)
                       else prepare_command(path, info.data))
            raise ValueError(f"LeRobot dataset {what}: {str(path)!r} (record one with "
                             f"`{command}`)")
        return path

    return Annotated[Path, Strict(False), AfterValidator(check), LOCATES_DATA]


class DemonstrationData(Section):
    """The fields every demonstration recipe's `data:` section has; a recipe adds its
    dataset root (`dataset_root`) and its own fields, and may change a default."""

    chunk: PositiveInt = 8
    """Actions predicted per step: the current one and the next chunk-1."""
    val_episodes: NonNegativeInt = 0
    """The last N episodes are held out: their action error is validated; 0 trains on every
    episode."""
    identity: Literal["content", "metadata"] = "content"
    """What the data's identity digests (a resume with other data is refused): "content",
    every byte (each file hashed once per machine, then cached), or "metadata", for data
    too large to hash: meta/, table footers and video headers only (see docs/lerobot.md)."""
