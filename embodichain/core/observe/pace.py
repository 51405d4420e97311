"""The data's pace (R-SCALE-2): examples per second and the share of time the loop waited
for its batches, since the last log line.

Each rank measures its own wait for an update's batches; the waits ride the update's
all-reduce (one slot per rank, core/training/learner.py), so rank 0 sees its own and the
largest over ranks, which is the one that holds every rank back. A share near 0 means the
device is the bottleneck; near 1, decoding or reading starves it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence


class DataPace:
    """Sums of rank 0's and the slowest rank's data waits between two log lines."""

    def __init__(self, examples_per_update: int) -> None:
        self.examples_per_update = examples_per_update
        self._since = time.perf_counter()
        self._updates = 0
        self._own = 0.0
        self._slowest = 0.0

    def add(self, waits: Sequence[float], rank: int = 0) -> None:
        """One update's waits, rank r's in slot r."""
        self._updates += 1
        if waits:
            self._own += waits[rank]
            self._slowest += max(waits)

    def metrics(self) -> dict[str, float]:
        """`time/examples_per_s`, `time/data_wait` (rank 0's share of the wall time) and
        `time/data_wait_max` (the slowest rank's) since the last call; then starts anew."""
        now = time.perf_counter()
        elapsed = max(now - self._since, 1e-9)
        values = {"time/examples_per_s": self._updates * self.examples_per_update / elapsed,
                  "time/data_wait": min(1.0, self._own / elapsed),
                  "time/data_wait_max": min(1.0, self._slowest / elapsed)}
        self._since, self._updates, self._own, self._slowest = now, 0, 0.0, 0.0
        return values
