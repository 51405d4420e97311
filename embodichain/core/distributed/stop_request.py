"""SIGINT / SIGTERM: stop every rank at the same update boundary, with a snapshot (R-SIG-1).

The handler only records the request. The trainer sends it with the next update's
statistics, which the update's own all-reduce sums, so every rank learns of a stop on any
rank at the same update without an extra collective. A second SIGINT stops at once.

A signal cannot run a Python handler while the main thread is blocked in C++ (a rendezvous
waiting for a worker that never comes), so, while the main thread is in a `blocking_wait`
(nothing trained yet: rendezvous, group creation), a thread woken by the signal (through
`signal.set_wakeup_fd`) ends the process with the signal's code after a short grace, instead
of leaving it to torchrun's SIGKILL 30 s later (R-PROC-3).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
# What a rank adds to the update's all-reduce: the sum tells every rank whether any rank was
# asked to stop, and whether any of them by SIGINT (exact in float32 for any world size).
FLAGS = {signal.SIGTERM: 1.0, signal.SIGINT: 4096.0}
GRACE_S = 1.0  # how long a blocked wait may still end by itself after a stop signal
_ACTIVE: StopRequest | None = None  # the installed request, for blocking_wait


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
        self._blocked_in: str | None = None  # what the main thread waits for, if anything
        self._wakeup: tuple[int, int, int] | None = None  # read fd, write fd, previous fd

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
        global _ACTIVE
        for sig in EXIT_CODES:
            self._previous[sig] = signal.signal(sig, self._handle)
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup = (read, write, previous)
        threading.Thread(target=self._watch_wakeups, args=(read,), daemon=True,
                         name="embodichain-stop-wakeup").start()
        _ACTIVE = self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            # A handler set after ours (e.g. SIGTERM ignored while a refusal exits) stays.
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, previous)
        self._previous.clear()
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._wakeup is not None:
            read, write, previous = self._wakeup
            self._wakeup = None
            with contextlib.suppress(ValueError, OSError):
                signal.set_wakeup_fd(previous)
            os.close(write)  # the watching thread reads EOF and ends (it closes `read`)

    def _watch_wakeups(self, read: int) -> None:
        """Woken with each signal's number; ends a main thread stuck in a blocking wait."""
        try:
            while data := os.read(read, 64):
                for signum in data:
                    if signum in EXIT_CODES and self._blocked_in is not None:
                        self._exit_if_still_blocked(signum)
        finally:
            os.close(read)

    def _exit_if_still_blocked(self, signum: int) -> None:
        deadline = time.monotonic() + GRACE_S
        while self._blocked_in is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        what = self._blocked_in
        if what is None:
            return  # the wait ended: the handler's request stops at the next boundary
        rank = os.environ.get("RANK", "0")
        prefix = f"[rank {rank}] " if rank != "0" else ""
        with contextlib.suppress(OSError):
            sys.stderr.write(f"{prefix}stopped by {signal_name(signum)} while waiting for "
                             f"{what}: nothing was trained\n")
            sys.stderr.flush()
        os._exit(EXIT_CODES[signum])

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


@contextlib.contextmanager
def blocking_wait(what: str) -> Iterator[None]:
    """Mark a wait of the main thread in C++ before anything is trained (e.g. "the other
    workers to join"): a stop signal meanwhile ends the process (see the module's doc)."""
    active = _ACTIVE
    if active is None:
        yield
        return
    active._blocked_in = what
    try:
        yield
    finally:
        active._blocked_in = None  # a stop asked meanwhile stops at the first boundary


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
