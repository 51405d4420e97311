"""A stuck rank is named (R-OPS-1): a watch thread on every rank bounds each update by
`trainer.collective_timeout`.

The main thread only notes, as each update starts, its number and the time (attribute
writes: no collective, no store request, no host read of a device value, R-GPU-1). The
watch thread looks at them every `POLL_S`, and every `STORE_POLL_S` asks the group's store
whether another rank raised the alarm. When the current update started more than the
timeout ago, or another rank raised the alarm, the rank:

1. writes its stack (faulthandler, every thread; the main thread's with its source lines) to
   RUN/hang/rank_N.txt and leaves it, with its update and position, in the store;
2. raises the alarm, so that every rank still alive does the same within `STORE_POLL_S`;
   (A rank whose peer failed and left its word, `process_group.leave_failure`, first
   gives that peer the timeout again, and at least `FAILED_PEER_S`, to end: its own
   message says what happened.)
3. waits up to `ANSWER_S` for the others' words: a rank that leaves none does not answer
   (stopped by SIGSTOP, frozen, or stuck where Python cannot run);
4. the lowest rank that answered (rank 0, unless it is the stuck one) writes the stacks that
   other nodes left in the store, ends the ranks on its host that a signal stopped (they
   take no signal but SIGKILL, which torchrun sends only 30 s after its SIGTERM), prints
   the one message (hang_report.message) and ends with exit code 1; the others end once it
   has spoken.

Not counted: validations and saves, where the other ranks wait for rank 0's own work
(`paused`), and the first update of each start or resume, which compiles and warms up;
torch's own collective timeout bounds those, and stays the backstop of a rank whose watch
cannot run (it is raised to the timeout plus `BACKSTOP_S` where torch's default is shorter).

The process ends at once (`os._exit`) from this thread: the main thread is blocked in C++,
where no exception reaches it. Snapshots are written whole (a temporary file, then a
rename), so the last one is intact and `resume` continues from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from embodichain.core.distributed import process_group
from embodichain.core.distributed.hang_report import (
    end_if_stopped,
    message,
    missing_stack,
    not_arrived,
    position,
    stack_file,
    stack_text,
    write_stack,
)

POLL_S = 0.25  # how often the watch looks at the main thread's update
STORE_POLL_S = 1.0  # how often it asks the store whether another rank raised the alarm
ANSWER_S = 3.0  # how long, after the alarm, the ranks wait for each other's stacks
SPOKEN_S = 20.0  # how long a rank waits for the reporting rank's message before it ends
FAILED_PEER_S = 60.0  # at least this long for a failed peer to end (it may close data workers)
BACKSTOP_S = 60.0  # torch's own timeout, the backstop, is at least this much longer
EXIT_CODE = 1


class HangWatch:
    """The watch of one rank's training loop; `progress` at each update, `paused` around
    rank 0's work, `close` when the loop ends."""

    def __init__(self, timeout_s: float, directory: Path, where_next: Callable[[], str],
                 record: Callable[[int, str], None], store: Any, prefix: str) -> None:
        self.timeout_s, self.directory = timeout_s, directory
        self.where_next, self.record = where_next, record  # see watch_collectives
        self._store, self._prefix = store, prefix
        self.rank, self.world_size = process_group.rank(), process_group.world_size()
        self.update = 0
        self._starts = 0
        self._since: float | None = None  # when the watched update started (None: none is)
        self._pauses = 0
        self._grace_until: float | None = None  # a failed peer's time to end (_peer_failed)
        self._main = threading.get_ident()
        self._closed = threading.Event()
        # Where this rank runs, said once: a rank that stops answering is described by it.
        self._set(f"origin_{self.rank}", json.dumps(process_group.rank_zero_origin()))
        self._thread = threading.Thread(target=self._watch, name="embodichain-hang-watch",
                                        daemon=True)
        self._thread.start()

    def progress(self, update: int) -> None:
        """Update `update` starts: from the second of this start on, it has the timeout."""
        self.update = update
        self._starts += 1
        self._since = time.monotonic() if self._starts > 1 else None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Rank 0's work (a validation, a save): not counted, nor anything after it until
        the next update starts (the end's save and its wait for rank 0's writes)."""
        self._pauses += 1
        try:
            yield
        finally:
            self._pauses -= 1
            self._since = None

    def close(self) -> None:
        self._closed.set()

    # -- the watch thread ----------------------------------------------------------------

    def _watch(self) -> None:
        poll, next_look = min(POLL_S, self.timeout_s / 8), 0.0
        while not self._closed.wait(poll):
            since, now = self._since, time.monotonic()
            late = since is not None and not self._pauses and now - since >= self.timeout_s
            if late and self._peer_failed(now):
                late = False
            if not late and now >= next_look:
                next_look = now + STORE_POLL_S
                late = self._check("alarm")
            if late and not self._closed.is_set():
                self._speak()

    def _peer_failed(self, now: float) -> bool:
        """Whether a peer failed and says why itself (its word in the store, left with
        `process_group.leave_failure`): it gets the timeout again (at least
        `FAILED_PEER_S`) to end before the alarm."""
        if self._grace_until is None:
            if process_group.failure_left_by_peers() is None:
                return False
            self._grace_until = now + max(self.timeout_s, FAILED_PEER_S)
        return now < self._grace_until

    def _key(self, name: str) -> str:
        return f"{self._prefix}hang/{name}"

    def _check(self, name: str) -> bool:
        with contextlib.suppress(Exception):  # the launcher's store gone: nobody to hear
            return bool(self._store.check([self._key(name)]))
        return False

    def _set(self, name: str, value: str) -> None:
        with contextlib.suppress(Exception):
            self._store.set(self._key(name), value)

    def _speak(self) -> None:
        """Steps 1-4 of the module's doc; ends the process."""
        where = position(self._main)
        header = (f"rank {self.rank} of {self.world_size}, update {self.update}, pid "
                  f"{os.getpid()} on {socket.gethostname()}: no new update for "
                  f"trainer.collective_timeout ({self.timeout_s:g} s), or another rank said so")
        stack = stack_text(header, self._main)
        write_stack(self.directory, self.rank, stack)
        self._set(f"rank_{self.rank}", json.dumps(
            {"update": self.update, "where": where, "stack": stack}))
        self._set("alarm", str(self.rank))
        answers = self._answers()
        reporter = min(answers)
        if reporter == self.rank:
            self._report(answers)
        else:
            deadline = time.monotonic() + SPOKEN_S
            while time.monotonic() < deadline and not self._check("spoken"):
                time.sleep(0.05)
        os._exit(EXIT_CODE)

    def _report(self, answers: dict[int, dict[str, Any]]) -> None:
        """As the reporting rank: every rank's stack file, then the message."""
        origins = self._origins(answers)
        missing = not_arrived(answers, self.world_size, origins)
        for rank in range(self.world_size):
            if stack_file(self.directory, rank).exists():
                continue  # written by the rank itself
            write_stack(self.directory, rank, answers[rank]["stack"] if rank in answers
                        else missing_stack(rank, missing[rank], self.rank))
        ended = tuple(r for r in sorted(origins) if end_if_stopped(origins[r]))
        said = message(answers, missing, self.rank, self.timeout_s, self.directory,
                       self.where_next(), ended)
        self.record(self.update, said)
        _say(f"error: {said}" if self.rank == 0 else f"[rank {self.rank}] error: {said}")
        self._set("spoken", str(self.rank))

    def _origins(self, answers: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """The pid and host of each rank that did not answer, as it said at the start."""
        found = {}
        for rank in set(range(self.world_size)) - set(answers):
            with contextlib.suppress(Exception):
                if self._check(f"origin_{rank}"):
                    found[rank] = json.loads(self._store.get(self._key(f"origin_{rank}")))
        return found

    def _answers(self) -> dict[int, dict[str, Any]]:
        """Every rank's word that comes within `ANSWER_S` (this rank's own among them)."""
        answers: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + ANSWER_S
        while True:
            for rank in range(self.world_size):
                if rank not in answers and self._check(f"rank_{rank}"):
                    with contextlib.suppress(Exception):
                        answers[rank] = json.loads(self._store.get(self._key(f"rank_{rank}")))
            if len(answers) == self.world_size or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        answers.setdefault(self.rank, {"update": self.update, "where": position(self._main),
                                       "stack": ""})  # the store gone: this rank alone
        return answers


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class NoWatch:
    """In one process, or a group a program made itself: nothing to wait for, or no store."""

    def progress(self, update: int) -> None:
        pass

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


def watch_collectives(timeout_s: float, directory: Path, where_next: Callable[[], str],
                      record: Callable[[int, str], None]) -> HangWatch | NoWatch:
    """The watch of this rank's training loop (started), with torch's own collective
    timeout kept at least `BACKSTOP_S` longer than `timeout_s`. `where_next()`: the
    snapshot to continue from and the command that does, the message's last sentence;
    `record(update, message)`: the reporting rank keeps the run's failure."""
    store, prefix = process_group.group_store()
    if not process_group.is_distributed() or store is None:
        return NoWatch()
    _keep_torch_timeout_behind(timeout_s)
    return HangWatch(timeout_s, directory, where_next, record, store, prefix)


def _keep_torch_timeout_behind(timeout_s: float) -> None:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    backstop = timedelta(seconds=timeout_s + BACKSTOP_S)
    if backstop > c10d._get_default_timeout(dist.get_backend()):
        c10d._set_pg_timeout(backstop)
