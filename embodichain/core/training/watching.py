"""What the trainer keeps an eye on besides the figures: the profile window (R-OPS-2), the
time split of each update (R-OPS-2), the allocator's history and the out-of-memory message
(R-OPS-3). One object, so that the loop calls it at three points: when it begins, around
each update, and at its end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from embodichain.core.distributed import process_group
from embodichain.core.errors import TrainingError
from embodichain.core.observe.progress import log
from embodichain.core.recipe.schema import TrainerConfig
from embodichain.core.training.memory import (
    dump_allocator_snapshot,
    out_of_memory_message,
    start_recording,
)
from embodichain.core.training.profiling import UpdateProfiler
from embodichain.core.training.time_split import TimeSplit


class UpdateWatch:
    """The profile, time split and memory snapshot of one trainer's run."""

    def __init__(self, config: TrainerConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        self.split = TimeSplit(device)
        self.profiler: UpdateProfiler | None = None
        self.recording = False

    def begin(self, directory: Path, first_step: int) -> None:
        """A fit starts at update `first_step` (0, or where a resumed run continues)."""
        self.split.restart()
        self.recording = self.recording or start_recording(self.device,
                                                            self.config.memory_snapshot)
        self.profiler = UpdateProfiler(self.config.profile, directory, self.device,
                                       process_group.rank(), first_step, self.recording)

    @contextlib.contextmanager
    def update(self, update: int, directory: Path) -> Iterator[None]:
        """Around update `update` (1-based): the profile's span, its window's start and end,
        and an out-of-memory error turned into its message."""
        if self.profiler is not None:
            self.profiler.before(update)
        try:
            yield
        except torch.OutOfMemoryError as exc:
            raise self.out_of_memory(exc, update - 1, directory) from exc
        if self.profiler is not None:
            self.profiler.after(update)

    def end(self, update: int) -> None:
        """The loop is over (at its end or by an error): a profile cut short is written,
        without hiding the error that ended it."""
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        try:
            profiler.close(update)
        except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more
            log.warning("the profile cut short at update %d could not be written: %s",
                        update, exc)

    def out_of_memory(self, error: BaseException, step: int, directory: Path
                      ) -> TrainingError:
        """The one message of a CUDA out-of-memory error in update `step + 1`, after the
        allocator's snapshot when `trainer.memory_snapshot` records it."""
        snapshot = None
        if self.recording:
            try:
                snapshot = dump_allocator_snapshot(directory, process_group.rank(),
                                                   f"oom_update_{step + 1}")
            except Exception as exc:  # noqa: BLE001 - the message must still come
                log.warning("the allocator snapshot could not be written: %s", exc)
        return TrainingError(out_of_memory_message(error, self.device, step, snapshot))
