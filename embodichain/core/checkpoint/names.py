"""The names of a run directory's checkpoints, without torch: `last.pt`, `best.pt` and the
step files `step_N.pt`, ordered by step number (never by name or time: `step_20.pt` is
older than `step_100.pt`, R-CKPT-7). Every other module names and parses them through here.
"""

from __future__ import annotations

import re
from pathlib import Path

LAST = "last.pt"
BEST = "best.pt"
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def step_filename(step: int) -> str:
    """`step_N.pt`, the snapshot of update N."""
    return f"step_{step}.pt"


def step_of(name: str) -> int | None:
    """N for a `step_N.pt` file name, None for any other name."""
    match = _STEP_FILE.match(name)
    return int(match.group(1)) if match else None


def is_checkpoint_name(name: str) -> bool:
    """Whether the run directory tools read `name` as a checkpoint (resume, runs, retention)."""
    return name in (LAST, BEST) or step_of(name) is not None


def step_files(directory: Path) -> list[tuple[int, Path]]:
    """The `step_N.pt` files of `directory` with their N, ordered by N."""
    found = [(step, path) for path in directory.glob("step_*.pt")
             if (step := step_of(path.name)) is not None]
    return sorted(found)


def snapshot_names(directory: Path) -> list[str]:
    """The step files ordered by N, then last.pt and best.pt where present."""
    extra = [name for name in (LAST, BEST) if (directory / name).is_file()]
    return [path.name for _, path in step_files(directory)] + extra
