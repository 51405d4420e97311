"""`trainer.on_nonfinite`: what a non-finite global loss does to a run (SPEC §9).

The loss is computed from the all-reduced totals of the update, so every rank sees the same
value and takes the same decision without a collective of its own. The update itself is never
applied (its gradients are as useless as its loss); `stop` ends the run there, `skip` lets it
count like a zero-weight batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.file import LAST, step_files


def nonfinite_loss(totals: Sequence[float]) -> bool:
    """Whether the update's global `[weight, weighted loss, ...]` totals give no finite loss.

    A zero weight is not non-finite: that batch simply has nothing to learn from.
    """
    weight, weighted_loss = totals[0], totals[1]
    return weight != 0.0 and not (math.isfinite(weight) and math.isfinite(weighted_loss))


def finite_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without non-finite numbers: metrics.jsonl is strict JSON (no NaN/Infinity)."""
    return {k: v for k, v in values.items()
            if not (isinstance(v, float) and not math.isfinite(v))}


def last_good_snapshot(directory: Path) -> Path | None:
    """The newest snapshot in the run directory (by step number), else last.pt, else None."""
    steps = step_files(directory)
    if steps:
        return steps[-1][1]
    return directory / LAST if (directory / LAST).is_file() else None


def stop_message(step: int, loss: float | None, directory: Path | None) -> str:
    """Why the run stopped at `step`, and where to continue from.

    `directory` None: a rank other than 0, which may not see the run directory (multi-node).
    """
    snapshot = last_good_snapshot(directory) if directory is not None else None
    where = (f"the last good snapshot is {snapshot}" if snapshot is not None
             else "rank 0 names the last good snapshot" if directory is None
             else f"no snapshot was saved in {directory} before it")
    return (f"non-finite training loss ({loss}) at update {step}: the run stopped there without "
            f"applying that update (trainer.on_nonfinite: stop); {where}. Lower optimizer.lr or "
            "set optimizer.grad_clip, or set trainer.on_nonfinite: skip to skip such updates")
