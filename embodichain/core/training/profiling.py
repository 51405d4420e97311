"""`trainer.profile: {start, updates}` (R-OPS-2): torch.profiler over those updates.

Every rank records CPU activity (and CUDA's when it trains on a GPU) with shapes and memory,
and writes `RUN/profile/rank_R.START.pt.trace.json`, a Chrome trace that Perfetto
(ui.perfetto.dev) and TensorBoard's profiler plugin (`tensorboard --logdir RUN/profile`,
which reads the name as worker `rank_R`, span `START`) open. Rank 0 also writes
`RUN/profile/top_operators.START.txt`, torch's table of the operators with the most self
time. A run that continues past `start` does not profile again: only a window that begins
after the update it continues from is recorded (`resume RUN --set trainer.profile.start=N`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from embodichain.core.observe.progress import log
from embodichain.core.recipe.profile_schema import ProfileConfig
from embodichain.core.training.memory import dump_allocator_snapshot

PROFILE_DIR = "profile"
TOP_OPERATORS = 30  # rows of the table


def trace_path(directory: Path, rank: int, start: int) -> Path:
    return directory / PROFILE_DIR / f"rank_{rank}.{start}.pt.trace.json"


def table_path(directory: Path, start: int) -> Path:
    return directory / PROFILE_DIR / f"top_operators.{start}.txt"


class UpdateProfiler:
    """Starts torch.profiler before update `config.start` and writes its outputs after
    update `config.last`; does nothing without a window or when the run continues from
    update `first_step` at or past its start."""

    def __init__(self, config: ProfileConfig | None, directory: Path, device: torch.device,
                 rank: int, first_step: int, snapshot: bool = False) -> None:
        self.config, self.directory, self.device, self.rank = config, directory, device, rank
        self.snapshot = snapshot and device.type == "cuda"
        self._active: profile | None = None
        self._span: record_function | None = None  # "update N" in the trace
        if config is not None and first_step >= config.start and rank == 0:
            log.info("trainer.profile: this run continues from update %d, at or past the "
                     "profile's start (%d): no profile (set trainer.profile.start to a later "
                     "update to record one)", first_step, config.start)
        self._due = config is not None and first_step < config.start

    def before(self, update: int) -> None:
        """Called before update `update` (1-based) runs."""
        if self._due and self.config is not None and update == self.config.start:
            self._start()
        self._open_span(update)

    def _start(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._active = profile(activities=activities, record_shapes=True,
                               profile_memory=True)
        self._active.__enter__()

    def _open_span(self, update: int) -> None:
        if self._active is not None:
            self._span = record_function(f"update {update}")
            self._span.__enter__()

    def _close_span(self) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.__exit__(None, None, None)

    def after(self, update: int) -> None:
        """Called once update `update` has run: the window's last writes the outputs."""
        self._close_span()
        if self._active is None:
            return
        if self.config is not None and update >= self.config.last:
            self._finish(update)

    def close(self, update: int) -> None:
        """The loop ended inside the window (an early stop, an error): what was recorded up
        to update `update` is written all the same."""
        if self._active is not None:
            self._finish(update)

    def _finish(self, update: int) -> None:
        self._close_span()
        active, self._active, self._due = self._active, None, False
        assert active is not None and self.config is not None
        active.__exit__(None, None, None)
        start = self.config.start
        trace = trace_path(self.directory, self.rank, start)
        trace.parent.mkdir(parents=True, exist_ok=True)
        active.export_chrome_trace(str(trace))
        if self.snapshot:
            dump_allocator_snapshot(self.directory, self.rank, f"profile_{start}")
        if self.rank != 0:
            return
        sort_by = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = active.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        path = table_path(self.directory, start)
        path.write_text(f"updates {start}..{update}, rank 0, by {sort_by}\n{table}\n")
        log.info("profile of updates %d..%d: a trace per rank in %s, the top operators in %s",
                 start, update, trace.parent, path)
