"""One process per machine at a time: an exclusive `fcntl.flock` on a lock file.

Start-up work done once per node (a file's digest, a table cache) is guarded by a lock file
rather than a collective: the first process does the work while the others on the machine
wait, however long it takes (hashing a terabyte must not run into a process group's
timeouts), then find it done. The lock belongs to the open file, so it is released when the
holder ends, even by SIGKILL: a dead process never leaves a node waiting.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class NodeLock:
    """`with NodeLock(path) as held:` holds an exclusive lock on `path` (created if missing)
    for the block; every other process asking for it waits. With `wait=False`, `held` is
    False at once when another process holds it. Creating it raises OSError where the lock
    file cannot be made (a read-only cache: the caller decides what to do without it)."""

    def __init__(self, path: Path, *, wait: bool = True) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._wait = wait

    def __enter__(self) -> bool:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if self._wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        os.close(self._fd)  # releases the lock
