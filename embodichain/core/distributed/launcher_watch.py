"""A worker whose launcher dies stops as if it got SIGTERM (R-PROC-1).

torch's elastic agent (torchrun, or `--nproc-per-node` self-launch) starts each worker with
`Popen(..., start_new_session=True)` from its main thread, so a SIGKILL of the agent, or of
its whole process group, reaches no worker: they would train on as orphans, holding the run
lock. Each worker therefore watches its parent: when the agent is gone (the worker was
re-parented, `os.getppid()` changed), it sends itself SIGTERM, which the stop request turns
into the usual stop at the next update boundary with a snapshot (R-SIG-1).

A polling thread rather than `prctl(PR_SET_PDEATHSIG)`: the death signal fires when the
*thread* that forked the worker exits, which ties correctness to how the launcher spawns;
the parent pid says the one thing that matters, on any Linux or macOS. A check every 0.2 s
costs nothing measurable.

After the agent is gone, its TCPStore (which hosts the rendezvous under `--standalone`) is
gone too; gloo collectives connect the workers directly, so the stop's last update, the
snapshot's gather and the group's teardown still work (see process_group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

PERIOD_S = 0.2
_started: int | None = None  # the parent pid being watched


def under_launcher() -> bool:
    """Whether this process is a worker started by torch's elastic agent."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launcher_gone() -> bool:
    """Whether the watched launcher has died (always False when nothing is watched)."""
    return _started is not None and os.getppid() != _started


def watch_launcher() -> None:
    """In a torchrun / self-launched worker: SIGTERM this process when its launcher dies.

    Call it as early as possible (the CLI does, before importing torch). Idempotent.
    """
    global _started
    if _started is not None or not under_launcher():
        return
    parent = os.getppid()
    _started = parent
    if parent == 1:  # already orphaned before we could look: the agent died at our start
        _signal_self()
        return
    threading.Thread(target=_watch, args=(parent,), name="embodichain-launcher-watch",
                     daemon=True).start()


def exit_at_once_if_orphaned(code: int | str | None) -> None:
    """When the launcher is gone, end this worker now with `code` (after flushing output),
    skipping the interpreter's teardown: nobody waits for an orphan, its run directory is
    complete (snapshot synced, lock released), and on a busy machine tearing torch down
    takes seconds of CPU that the next `resume` would wait for."""
    if not launcher_gone():
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def _watch(parent: int) -> None:
    stop = threading.Event()
    while not stop.wait(PERIOD_S):
        if os.getppid() != parent:
            _signal_self()
            return


def _signal_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
