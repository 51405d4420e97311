"""Data workers ignore the stop signals meant for their rank and end with it (R-PREEMPT-1).

A batch system stops a job by signalling every process of it (SLURM's preemption and
`scancel`, a container stop), and torch's elastic agent passes SIGINT / SIGTERM on to each
worker's whole process group, which holds the rank's DataLoader workers too. torch's own
worker handler dies of a SIGTERM not sent by its parent, and SIGINT ends its loop: either
way the rank then failed with "a data worker process died" instead of stopping at an update
boundary with a snapshot (R-SIG-1). So each data worker ignores SIGINT and SIGTERM from its
start (`started`, the DataLoader's `worker_init_fn`) and leaves the stop to its rank, which
ends it as before: the rank's `close()` sends torch's final message and, since SIGTERM no
longer ends a worker, SIGKILLs one still there after torch's grace (`end_left_over`); a
worker whose rank died notices within torch's 5 s status check (its parent pid changes)
and exits.

A worker forked between the signal and its `worker_init_fn` would still die of it, so the
rank blocks the stop signals while it starts workers (`starting_workers`): the child inherits
the blocked mask and unblocks it only once it ignores them; the rank takes a signal that came
meanwhile as soon as it unblocks.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
JOIN_S = 5.0  # after SIGKILL: a killed process is reaped at once; bounded all the same


def started(worker_id: int) -> None:
    """The DataLoader's `worker_init_fn`: ignore the rank's stop signals from now on."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    # A forked worker inherits its rank's wake-up pipe (stop_request): not its to write.
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def starting_workers() -> Iterator[None]:
    """Block the stop signals in this thread while it starts data workers (see above)."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no fork, no process groups
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def end_left_over(workers: Iterable[Any]) -> None:
    """SIGKILL the data workers (multiprocessing Processes) still alive after torch's
    shutdown, which ends a late one with SIGTERM, ignored here: one busy in a long
    `__getitem__`. Otherwise it would outlive its rank until that finished, and Python's
    own exit, which joins its children after a SIGTERM, would wait for it."""
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(JOIN_S)
