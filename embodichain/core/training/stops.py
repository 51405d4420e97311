"""How a fit that was asked to stop ends: the Stopped error and its message (R-SIG-1).

Normally every rank finishes the same update and rank 0 saves it first. A stop can also
meet a rank that no longer answers (hung or stopped, R-PROC-3): the rank waiting for it
ends itself after a grace (distributed/stop_request), and the ranks that were still working
then find it gone in their next collective. They stop too, without a snapshot of this
update: the last one stands, and the same resume command continues from it, exactly.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from embodichain.core.checkpoint.names import LAST
from embodichain.core.distributed.hang_watch import HangWatch, NoWatch, watch_collectives
from embodichain.core.distributed.stop_request import EXIT_CODES, StopRequest, signal_name
from embodichain.core.errors import Stopped, TrainingError
from embodichain.core.runs.commands import SELF_LAUNCHED, resume_command
from embodichain.core.runs.run_end import record_failure
from embodichain.core.runs.snapshots import where_to_continue


def stopped(signum: int, step: int, max_updates: int, directory: Path, world_size: int
            ) -> Stopped:
    """The stop after the snapshot of `step` was saved on every rank's behalf."""
    return Stopped(
        f"stopped by {signal_name(signum)} at update {step} of {max_updates}: saved "
        f"{directory / LAST} (update {step}), so no work is lost. Continue with: "
        f"{resume_command(directory, world_size)}{torchrun_note()}",
        EXIT_CODES[signum])


def torchrun_note() -> str:
    """Under a plain `torchrun`, whose agent prints a traceback of its own for the signal
    (`torch.distributed.elastic.multiprocessing.api.SignalException`) after this line."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or os.environ.get(SELF_LAUNCHED):
        return ""
    return ("\n(torchrun stops on the same signal: the SignalException traceback it may "
            "print below is torchrun's own, not a failure of this run)")


def peer_gone(exc: BaseException, stop: StopRequest | None, distributed: bool) -> bool:
    """Whether `exc` is a collective's failure because another rank ended after a stop
    signal (torch raises DistError, a RuntimeError, when a gloo peer closes)."""
    return (distributed and stop is not None and stop.requested
            and isinstance(exc, RuntimeError))


def stopped_without_snapshot(signum: int, step: int, max_updates: int, directory: Path,
                             world_size: int, exc: BaseException) -> Stopped:
    """The stop when another rank ended before this update's snapshot could be taken."""
    return Stopped(
        f"stopped by {signal_name(signum)} at update {step} of {max_updates}, but another "
        f"rank ended before the stop's snapshot could be taken ({_reason(exc)}): the last "
        f"snapshot in {directory} is kept, and the updates after it are done again. "
        f"Continue with: {resume_command(directory, world_size)}",
        EXIT_CODES[signum])


def _reason(exc: BaseException) -> str:
    """gloo's first sentence without its source location ("Read error ...: Connection
    reset by peer"), or the exception's type."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    return re.sub(r"^.*?\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", lines[0]).split(". ")[0]


def hang_watch(timeout_s: float, directory: Path, world_size: int) -> HangWatch | NoWatch:
    """The fit's watch (R-OPS-1, distributed/hang_watch): its message ends with the snapshot
    and the command that continue the run, and run.json keeps it as the run's failure."""
    def record(update: int, said: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # another node: no run directory
            record_failure(directory, update, TrainingError(said))

    return watch_collectives(
        timeout_s, directory, lambda: f"{where_to_continue(directory)}; continue with: "
        f"{resume_command(directory, world_size)}", record)
