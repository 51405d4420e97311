"""SIGINT / SIGTERM: stop every rank at the same update boundary, with a snapshot (R-SIG-1).

The handler only records the request. The trainer sends it with the next update's
statistics, which the update's own all-reduce sums, so every rank learns of a stop on any
rank at the same update without an extra collective. A second SIGINT stops at once.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
# What a rank adds to the update's all-reduce: the sum tells every rank whether any rank was
# asked to stop, and whether any of them by SIGINT (exact in float32 for any world size).
FLAGS = {signal.SIGTERM: 1.0, signal.SIGINT: 4096.0}


def signal_of(flag_sum: float) -> int | None:
    """The stop signal every rank reports for the all-reduced flags: SIGINT if any rank got
    one, else SIGTERM; None when no rank was asked to stop."""
    if flag_sum >= FLAGS[signal.SIGINT]:
        return signal.SIGINT
    return signal.SIGTERM if flag_sum > 0 else None


class StopRequest:
    """Installed for the fit: `signum` is the first stop signal received, or None."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def flag(self) -> float:
        """This rank's contribution to the update's all-reduce (0.0: no stop asked)."""
        return FLAGS.get(self.signum, 1.0) if self.signum is not None else 0.0

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in EXIT_CODES:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            # A handler set after ours (e.g. SIGTERM ignored while a refusal exits) stays.
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without a snapshot
        if self.signum is None:
            self.signum = signum

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
