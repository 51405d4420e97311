"""`trainer.on_nonfinite`: what a non-finite global loss does to a run (design §9).

The loss is computed from the all-reduced totals of the update, so every rank sees the same
value and takes the same decision without a collective of its own. The update itself is never
applied (its gradients are as useless as its loss); `stop` ends the run there, `skip` lets it
count like a zero-weight batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from embodichain.core.runs.snapshots import newest_snapshot_path


def nonfinite_loss(totals: Sequence[float]) -> bool:
    """Whether the update's global `[weight, weighted loss, ...]` totals give no finite loss.

    A zero weight is not non-finite: that batch simply has nothing to learn from.
    """
    weight, weighted_loss = totals[0], totals[1]
    return weight != 0.0 and not (math.isfinite(weight) and math.isfinite(weighted_loss))


def stop_message(step: int, loss: float | None, directory: Path | None) -> str:
    """Why the run stopped at `step`, and where to continue from.

    `directory` None: a rank other than 0, which may not see the run directory (multi-node).
    """
    snapshot = newest_snapshot_path(directory) if directory is not None else None
    where = (f"the last good snapshot is {snapshot}" if snapshot is not None
             else "rank 0 names the last good snapshot" if directory is None
             else f"no snapshot was saved in {directory} before it")
    return (f"non-finite training loss ({loss}) at update {step}: the run stopped there without "
            f"applying that update (trainer.on_nonfinite: stop); {where}. Lower optimizer.lr or "
            "set optimizer.grad_clip, or set trainer.on_nonfinite: skip to skip such updates")
