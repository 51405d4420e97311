"""What the trainer keeps an eye on besides the figures: the profile window (R-OPS-2), the
time split of each update (R-OPS-2), the allocator's history and the out-of-memory message
(R-OPS-3), and the watch that names a stuck rank (R-OPS-1). One object, so that the loop
calls it at three points: when it begins, around each update, and at its end; and pauses
the hang watch where the other ranks wait for rank 0's own work."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from embodichain.core.distributed import process_group
from embodichain.core.distributed.hang_watch import HangWatch, NoWatch
from embodichain.core.errors import TrainingError
from embodichain.core.observe.progress import log
from embodichain.core.recipe.schema import TrainerConfig
from embodichain.core.training.memory import (
    dump_allocator_snapshot,
    out_of_memory_message,
    start_recording,
)
from embodichain.core.training.profiling import UpdateProfiler
from embodichain.core.training.stops import hang_watch
from embodichain.core.training.time_split import TimeSplit


class UpdateWatch:
    """The profile, time split, memory snapshot and hang watch of one trainer's run."""

    def __init__(self, config: TrainerConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        self.split = TimeSplit(device)
        self.profiler: UpdateProfiler | None = None
        self.recording = False
        self.hang: HangWatch | NoWatch = NoWatch()  # bounds each update (R-OPS-1)

    def begin(self, directory: Path, first_step: int) -> None:
        """A fit starts at update `first_step` (0, or where a resumed run continues)."""
        self.split.restart()
        self.recording = self.recording or start_recording(self.device,
                                                            self.config.memory_snapshot)
        self.profiler = UpdateProfiler(self.config.profile, directory, self.device,
                                       process_group.rank(), first_step, self.recording)
        self.hang = hang_watch(self.config.collective_timeout, directory,
                               process_group.world_size())

    @contextlib.contextmanager
    def update(self, update: int, directory: Path) -> Iterator[None]:
        """Around update `update` (1-based): the profile's span, its window's start and end,
        and an out-of-memory error turned into its message; the hang watch's clock starts."""
        self.hang.progress(update)
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
        self.hang.close()
        profiler, self.profiler = self.profiler, None
        if profiler is None:
            return
        try:
            profiler.close(update)
        except Exception as exc:  # noqa: BLE001 - the run's own outcome matters more
            log.warning("the profile cut short at update %d could not be written: %s",
                        update, exc)

    def paused(self) -> contextlib.AbstractContextManager[None]:
        """Around a validation or a save, where the others may wait for rank 0's own work:
        the hang watch does not count it (the next update starts its clock again)."""
        return self.hang.paused()

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
