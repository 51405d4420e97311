"""SIGINT / SIGTERM: stop every rank at the same update boundary, with a snapshot (R-SIG-1).

The handler only records the request. The trainer sends it with the next update's
statistics, which the update's own all-reduce sums, so every rank learns of a stop on any
rank at the same update without an extra collective. A second SIGINT stops at once, unless
it comes within `SAME_STOP_S` of the first stop signal: that is the same Ctrl-C (or
`scancel --signal=INT`) delivered twice, once to every process of the job and once more by
a launcher or wrapper passing it on (R-PREEMPT-1).

A signal cannot run a Python handler while the main thread is blocked in C++: a rendezvous
waiting for a worker that never comes, or a collective waiting for a rank that hangs or was
stopped (SIGSTOP, a stuck GPU, a dead NFS mount). Such waits are marked (`blocking_wait`);
after a stop signal, a thread woken by it (through `signal.set_wakeup_fd`) watches the main
thread, and one that stays in a marked wait without running (no Python executed, no CPU
time used: a wait sleeps) for the wait's grace ends the process with the signal's code and
one line saying where it was stuck and what that costs, instead of torchrun's SIGKILL 30 s
later with no word (R-PROC-3). Before training the grace is 1 s (nothing is lost); in an
update's collectives it is `TRAINING_GRACE_S`, and `RANK_ZERO_GRACE_S` where the other ranks
wait for rank 0 to validate or save, each longer than a healthy wait, so that a stop whose
ranks all answer still ends with its snapshot. The rank that was waited for then finds its
peer gone and stops too, keeping the last snapshot (training/stops).
"""

from __future__ import annotations

import contextlib
import dataclasses
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
GRACE_S = 1.0  # before training: how long a stuck wait may still end by itself
TRAINING_GRACE_S = 10.0  # an update's collectives: well above a healthy wait for a peer
RANK_ZERO_GRACE_S = 25.0  # waits for rank 0's validation or save: longer, under torchrun's 30 s
SAME_STOP_S = 1.0  # a SIGINT this soon after the first stop signal is that signal again
POLL_S = 0.05  # how often the woken thread looks at the main thread, after a stop signal
RUNNING_CPU_S = 0.001  # CPU time per look that shows the main thread running, not waiting
_ACTIVE: StopRequest | None = None  # the installed request, for blocking_wait


@dataclasses.dataclass(frozen=True)
class Wait:
    """A wait of the main thread in C++: what it waits for, and what ending it costs."""

    what: str  # e.g. "the other workers to join"
    grace_s: float
    cost: str  # e.g. "nothing was trained"


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
        self._since = 0.0  # time.monotonic() of the first stop signal
        self._previous: dict[int, Any] = {}
        self._waiting: Wait | None = None  # the main thread's marked wait, if any
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
        """Woken with each signal's number; after the first stop signal, watches the main
        thread until the request is uninstalled (uninstall closes the pipe's write end)."""
        try:
            while data := os.read(read, 64):
                signum = next((s for s in data if s in EXIT_CODES), None)
                if signum is not None:
                    self._end_a_stuck_wait(signum)
        finally:
            os.close(read)

    def _end_a_stuck_wait(self, signum: int) -> None:
        """End the process when the main thread stays in a marked wait for that wait's
        grace without running: neither its Python position nor its CPU time moves (a
        collective's wait sleeps; Python, or a long C++ computation, uses the CPU; sampling
        the position alone misses a tight Python loop, always seen at the same instruction,
        where it lets other threads in). Returns when the request is uninstalled."""
        main = threading.main_thread().ident
        seen, cpu_seen, since = None, _cpu_time(main), time.monotonic()
        while self._wakeup is not None:
            waiting = self._waiting
            frame = sys._current_frames().get(main) if waiting is not None else None
            where = (id(frame), frame.f_lasti) if frame is not None else None
            del frame
            cpu, now = _cpu_time(main), time.monotonic()
            ran = where != seen or (cpu is not None and cpu_seen is not None
                                    and cpu - cpu_seen > RUNNING_CPU_S)
            seen, cpu_seen = where, cpu
            if waiting is None or ran:
                since = now
            elif now - since >= waiting.grace_s:
                self._exit_stuck(signum, waiting)
            time.sleep(POLL_S)

    def _exit_stuck(self, signum: int, waiting: Wait) -> None:
        rank = os.environ.get("RANK", "0")
        prefix = f"[rank {rank}] " if rank != "0" else ""
        with contextlib.suppress(OSError):
            sys.stderr.write(f"{prefix}stopped by {signal_name(signum)} while waiting for "
                             f"{waiting.what}: {waiting.cost}\n")
            sys.stderr.flush()
        os._exit(EXIT_CODES[signum])

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self.signum is None:
            self.signum, self._since = signum, now
        elif signum == signal.SIGINT and now - self._since > SAME_STOP_S:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now, without a snapshot

    def __enter__(self) -> StopRequest:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


@contextlib.contextmanager
def blocking_wait(what: str, grace_s: float = GRACE_S, cost: str = "nothing was trained"
                  ) -> Iterator[None]:
    """Mark a wait of the main thread in C++ for `what` (e.g. "the other workers to join"):
    after a stop signal, staying in it `grace_s` without running Python ends the process,
    printing `cost` (see the module's doc)."""
    active = _ACTIVE
    if active is None:
        yield
        return
    outer = active._waiting
    active._waiting = Wait(what, grace_s, cost) if outer is None else outer
    try:
        yield
    finally:
        active._waiting = outer  # a stop asked meanwhile stops at the next boundary


# A refused or failed distributed run ignores SIGTERM from then on (process_group), so that
# torchrun's closing SIGTERM does not turn its exit code into -15. In the CLI that lasts
# until the process exits; a program that goes on after `train()` raised gets its handler
# back when the run's `distributed_run` ends (`sigterm_given_back`).
_SIGTERM: dict[str, Any] = {"ignored": 0, "until_exit": False}


def ignore_sigterm() -> None:
    """Ignore SIGTERM until the process exits, or a `sigterm_given_back` block ends."""
    with contextlib.suppress(ValueError):  # not the main thread: cannot change it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _SIGTERM["ignored"] += 1


def sigterm_ignored_until_exit() -> None:
    """Called by the CLI, whose process ends with its run: SIGTERM, once ignored, stays so."""
    _SIGTERM["until_exit"] = True


@contextlib.contextmanager
def sigterm_given_back() -> Iterator[None]:
    """After the block, SIGTERM's handler from before it, if the block ignored SIGTERM
    (`ignore_sigterm`) and it is still ignored; but in the CLI."""
    before, ignored = signal.getsignal(signal.SIGTERM), _SIGTERM["ignored"]
    try:
        yield
    finally:
        if (_SIGTERM["ignored"] != ignored and not _SIGTERM["until_exit"]
                and before is not None
                and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN):
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGTERM, before)


def _cpu_time(thread: int | None) -> float | None:
    """The CPU time a thread of this process has used (None where the OS cannot tell)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread))  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        return None


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
