"""Where an update's time goes (R-OPS-2), logged with every training line as seconds per
update since the last line:

- `time/split/data`: this rank waiting for its batches (before the update and, under
  accumulation, for each micro-batch inside it);
- `time/split/forward_backward`: the micro-batches' forward and backward passes, with the
  gradient reduction they overlap (DDP's buckets, FSDP's reduce-scatter);
- `time/split/step`: from the last backward to the update's end: the reduction's finish,
  clipping, the optimizer step, the EMA and the schedule;
- `time/split/other`: the rest of the wall time: logging, saves, validation, the loop.

No phase waits for the device (R-GPU-1): on the CPU the clock is the host's; on CUDA each
boundary is an event recorded on the stream, and an update's events are read only once the
device has passed them (`Event.query`, which does not wait); an update not yet finished
there counts in the next line. Device time and host waits may overlap on CUDA, so there
`other` is what is left of the wall time, never below zero.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

PHASES = ("data", "forward_backward", "step", "other")


@dataclass(eq=False)
class _Update:
    data: float  # host seconds waiting for batches, all of them
    inside: float  # of which inside the forward-backward span
    marks: list[Any]  # start, backward done, end: host seconds or CUDA events


class TimeSplit:
    """The marks of each update and their sums between two log lines."""

    def __init__(self, device: torch.device) -> None:
        self._cuda, self._device = device.type == "cuda", device
        self._since = time.perf_counter()
        self._started = 0  # updates begun since the last line
        self._pending: list[_Update] = []
        self._marks: list[Any] = []

    def restart(self) -> None:
        """A fit begins: the first line's wall time starts here, not at the trainer's build."""
        self._since, self._started, self._pending = time.perf_counter(), 0, []

    def _mark(self) -> Any:
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))  # where the update runs
        return event

    def begin(self) -> None:
        """The update's batches (its first, under accumulation) are at hand."""
        self._started += 1
        self._marks = [self._mark()]

    def backward_done(self) -> None:
        """The last micro-batch's backward is queued."""
        self._marks.append(self._mark())

    def end(self, data: float, inside: float) -> None:
        """The update is queued; `data` seconds waited for batches, `inside` of them within
        the forward-backward span."""
        self._marks.append(self._mark())
        if len(self._marks) == 3:
            self._pending.append(_Update(data, inside, self._marks))
        self._marks = []

    def _seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1000 if self._cuda else b - a

    def metrics(self) -> dict[str, float]:
        """`time/split/<phase>` in seconds per update since the last call; then anew."""
        now = time.perf_counter()
        done: list[_Update] = []
        waiting: list[_Update] = []
        for u in self._pending:
            (done if not self._cuda or u.marks[-1].query() else waiting).append(u)
        self._pending = waiting
        wall, started = now - self._since, self._started
        self._since, self._started = now, 0
        if not done or not started:
            return {}
        sums = dict.fromkeys(PHASES, 0.0)
        for u in done:
            start, backward, end = u.marks
            sums["data"] += u.data
            sums["forward_backward"] += max(0.0, self._seconds(start, backward) - u.inside)
            sums["step"] += max(0.0, self._seconds(backward, end))
        values = {f"time/split/{k}": sums[k] / len(done) for k in PHASES[:-1]}
        values["time/split/other"] = max(0.0, wall / started - sum(values.values()))
        return values
