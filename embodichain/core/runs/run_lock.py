"""One writer per run directory (R-RUN-5): an OS advisory lock held for the run's whole life.

Rank 0 takes `flock` on `RUN_DIR/.lock` before it touches anything else there and keeps it
until the process ends. The kernel releases the lock when the process dies, however it
dies, so a crash never leaves a stale lock. The file also records who holds it (host, pid,
since when), which is what a refused second writer and `embodichain runs` report.

An flock belongs to the open file, which a forked child (a DataLoader worker) shares: a
worker outliving a SIGKILLed trainer by its few seconds of noticing would keep the directory
"in use" by a dead pid. So every forked child closes its copy at once (which leaves the
parent's lock alone; only an unlock or the last close releases it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import IO, Any

from embodichain.core.errors import RefusedError
from embodichain.core.runs.run_dir import unusable_output_dir

LOCK = ".lock"
_HELD: set[RunLock] = set()  # this process's locks, which a forked child lets go of


def _close_inherited_locks() -> None:
    for lock in list(_HELD):
        lock._forget()  # takes it out of _HELD


os.register_at_fork(after_in_child=_close_inherited_locks)


class RunLock:
    """An exclusive, non-blocking lock on a run directory, kept until `release()` or exit."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise RefusedError naming the live holder; creates the directory.

        The file's content is left as it is until `publish()`, so a command that takes the
        lock and then refuses changes nothing in the directory.
        """
        if self._file is not None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            f = open(self.directory / LOCK, "a+")  # noqa: SIM115 - held for the run's life
        except OSError as exc:  # e.g. under a file, or no permission: bad input, exit 2
            raise unusable_output_dir(self.directory, exc, self.directory / LOCK) from None
        for attempt in range(20):
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = lock_holder(self.directory)
                # None: only a reader (`runs`, a refusal check) held it for a moment.
                if holder is not None or attempt == 19:
                    f.close()
                    raise _in_use(self.directory, holder or {}) from None
                time.sleep(0.01)
        self._file = f
        _HELD.add(self)

    def publish(self, started_at: str) -> None:
        """Record this process as the holder (host, pid, since), once the run goes ahead."""
        if self._file is None:
            raise RuntimeError("publish() before acquire()")
        self._file.seek(0)
        self._file.truncate()
        json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": started_at},
                  self._file)
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
        self._forget()

    def _forget(self) -> None:
        """Close this process's descriptor without unlocking (a forked child's copy)."""
        _HELD.discard(self)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def lock_holder(directory: Path) -> dict[str, Any] | None:
    """Who holds the directory's lock now (host, pid, since), or None if nobody does."""
    path = Path(directory) / LOCK
    try:
        f = open(path)  # noqa: SIM115
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                return json.loads(f.read() or "{}")
            except ValueError:
                return {}
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return None


def last_holder(directory: Path) -> dict[str, Any]:
    """Who held the lock last (host, pid, since), whether or not it still does: the file
    keeps the last holder's record after it ends ({} if none can be read)."""
    try:
        found = json.loads((Path(directory) / LOCK).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def refuse_if_locked(directory: Path) -> None:
    """RefusedError naming the holder when a live run holds `directory`; changes nothing."""
    holder = lock_holder(directory)
    if holder is not None:
        raise _in_use(directory, holder)


def _in_use(directory: Path, holder: dict[str, Any]) -> RefusedError:
    if _ended_here(holder):
        return RefusedError(
            f"{directory} is still locked although the run that locked it has ended "
            f"({describe_holder(holder)}): a process it started holds its lock file "
            f"({Path(directory) / LOCK}; `fuser -v` on it names the process). Once that "
            "process ends, run this command again. Nothing was changed.")
    return RefusedError(
        f"{directory} is in use by a live run ({describe_holder(holder)}); only one process "
        "may write a run directory. Wait for it to end or stop it (Ctrl-C saves a snapshot), "
        "then run this command again. Nothing was changed.")


def _ended_here(holder: dict[str, Any]) -> bool:
    """Whether the recorded holder was a process of this machine that no longer exists."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    return False


def describe_holder(holder: dict[str, Any]) -> str:
    host = holder.get("host", "unknown host")
    pid = holder.get("pid", "unknown pid")
    since = holder.get("since", "an unknown time")
    return f"held by pid {pid} on {host} since {since}"
