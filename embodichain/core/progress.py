"""Rank-0 progress: a rich bar on a terminal, plain periodic lines otherwise (R-UX-1)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

log = logging.getLogger("embodichain")


def configure_logging(rank: int) -> None:
    """Rank 0 logs info; other ranks only warnings and errors, prefixed with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    prefix = "" if rank == 0 else f"[rank {rank}] "
    handler.setFormatter(logging.Formatter(prefix + "%(levelname)s: %(message)s"
                                           if rank else "%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    if rank:
        # Python warnings (e.g. from torch) get the same rank prefix on the other ranks.
        logging.captureWarnings(True)
        warnings_log = logging.getLogger("py.warnings")
        warnings_log.handlers[:] = [handler]
        warnings_log.propagate = False


class ProgressReporter:
    """Shows update N/total, loss, last validation MSE, updates/s and ETA."""

    def __init__(self, total: int, start: int, enabled: bool, every: int) -> None:
        self.total = total
        self.every = every
        self.console = Console(stderr=True)
        self.rich = enabled and self.console.is_terminal
        self.plain = enabled and not self.rich
        self.loss = float("nan")
        self.val_mse: float | None = None
        self._t0 = time.perf_counter()
        self._start = start
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.rich:
            self._progress = Progress(
                TextColumn("[bold]update"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[status]}"), TimeRemainingColumn(),
                console=self.console, transient=False,
            )
            self._task = self._progress.add_task("fit", total=total, completed=start,
                                                 status="")
            self._progress.start()

    def elapsed(self) -> float:
        """Seconds since this fit started (the `time/elapsed_s` metric)."""
        return time.perf_counter() - self._t0

    def rate(self, step: int) -> float:
        elapsed = time.perf_counter() - self._t0
        return (step - self._start) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, **values: Any) -> None:
        """Record the latest values; `loss` and `val_mse` are optional."""
        if "loss" in values:
            self.loss = values["loss"]
        if "val_mse" in values:
            self.val_mse = values["val_mse"]
        if self._progress is not None:
            if values:  # the status text changes at log and validation steps only
                self._progress.update(self._task, completed=step, status=self._status(step))
            else:
                self._progress.update(self._task, completed=step)
        elif self.plain and not values and (step % self.every == 0 or step == self.total):
            rate = self.rate(step)
            eta = (self.total - step) / rate if rate else float("nan")
            log.info("update %d/%d  %s  eta %.0fs", step, self.total, self._status(step), eta)

    def _status(self, step: int) -> str:
        val = f"{self.val_mse:.4g}" if self.val_mse is not None else "-"
        return f"loss {self.loss:.4g}  val_mse {val}  {self.rate(step):.1f} upd/s"

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
