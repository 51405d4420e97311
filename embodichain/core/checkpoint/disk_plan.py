"""A warning at the start of a run whose checkpoint schedule cannot end well.

`trainer.save_every: 100` with `trainer.max_updates: 1000000000000000000` plans 10^16 step
files: the run fills the disk long before it ends. Step files are kept unless
`trainer.keep_last` says otherwise (R-RUN-4), so that is the key to point at.
"""

from __future__ import annotations

import errno
import logging
import shutil
from pathlib import Path
from typing import Any

from embodichain.core.recipe.machine_limits import readable_size

MAX_STEP_FILES = 1000
"""More planned step files than this is a mistake more often than a plan."""

_OVERHEAD_BYTES = 64 * 1024  # manifest, recipe, per-rank RNG and sampler states


def estimate_checkpoint_bytes(tensor_bytes: int, optimizer: str) -> int:
    """About how large one checkpoint is: the model, the optimizer's state, some metadata.

    Adam(W) keeps two tensors per parameter, SGD at most one (momentum).
    """
    factor = 3 if optimizer in ("adam", "adamw") else 2
    return tensor_bytes * factor + _OVERHEAD_BYTES


def free_bytes(directory: Path) -> int | None:
    """Free space on the file system that `directory` is (or will be) on."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        return shutil.disk_usage(existing).free
    except OSError:
        return None


def checkpoint_plan_warning(*, max_updates: int, step: int, save_every: int,
                            keep_last: int | None, directory: Path,
                            checkpoint_bytes: int) -> str | None:
    """What is wrong with the planned step files, or None when nothing is."""
    if not save_every:
        return None
    planned = max_updates // save_every - step // save_every
    kept = planned if keep_last is None else min(planned, keep_last)
    needed = (kept + 1) * checkpoint_bytes  # + last.pt
    free = free_bytes(directory)
    problems = []
    if kept > MAX_STEP_FILES:
        problems.append(f"{planned:,} step files")
    if free is not None and needed > free:
        problems.append(f"about {readable_size(needed)} of checkpoints, more than the "
                        f"{readable_size(free)} free on the disk of {directory}")
    if not problems:
        return None
    fix = ("set trainer.keep_last (e.g. --set trainer.keep_last=5) to keep only the newest "
           "step files" if keep_last is None else
           "lower trainer.keep_last")
    return (f"trainer.save_every: {save_every} with trainer.max_updates: {max_updates} plans "
            f"{' and '.join(problems)}; {fix}, or raise trainer.save_every")


def warn_about_checkpoint_plan(trainer: Any, optimizer: str, model: Any, step: int,
                               directory: Path) -> None:
    """Log a warning when the planned step files are too many for sense or for the disk
    (`trainer`: the recipe's trainer section; `model`: the unwrapped model)."""
    model_bytes = sum(v.numel() * v.element_size() for v in model.state_dict().values())
    warning = checkpoint_plan_warning(
        max_updates=trainer.max_updates, step=step, save_every=trainer.save_every,
        keep_last=trainer.keep_last, directory=directory,
        checkpoint_bytes=estimate_checkpoint_bytes(model_bytes, optimizer))
    if warning is not None:
        logging.getLogger("embodichain").warning("warning: %s", warning)


class DiskFullError(OSError):
    """A checkpoint that did not fit on its disk: how much it needed and how much was free.

    torch reports a full disk in its own words (`[enforce fail at inline_container.cc]
    unexpected pos ...`), with the `No space left on device` only in the exception's
    context; this names it, with the numbers the start-up warning also uses.
    """

    def __init__(self, path: Path, needed: int | None, free: int | None) -> None:
        parts = [f"the checkpoint needs {readable_size(needed)}" if needed is not None else None,
                 f"{readable_size(free)} are free" if free is not None else None]
        detail = ", ".join(p for p in parts if p)
        super().__init__(errno.ENOSPC, f"the disk is full (No space left on device): {detail} "
                         f"on the file system of {path.parent}" if detail
                         else "the disk is full (No space left on device)", str(path))
        self.needed, self.free = needed, free


def disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from or during, is a full disk (or quota)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        current = current.__cause__ or current.__context__
    return False


class _CountingSink:
    """A write-only file that keeps only the number of bytes written to it."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        pass


def serialized_bytes(save: Any, value: Any) -> int | None:
    """The bytes `save(value, file)` writes (serialised again, into nothing)."""
    sink = _CountingSink()
    try:
        save(value, sink)
    except Exception:
        return None
    return sink.count
