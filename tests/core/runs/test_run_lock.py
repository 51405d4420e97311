"""The run directory's lock ends with the process that took it, not with its forked children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from embodichain.core.errors import RefusedError
from embodichain.core.runs.run_lock import RunLock, last_holder, lock_holder
from tests.support.processes import REPO

# Takes the lock, forks a child that outlives it (as a DataLoader worker outlives a SIGKILLed
# trainer until it notices), prints the child's pid and waits to be killed. Bounded: the child
# sleeps 30 s at most, the holder 60 s.
HOLDER = """
import multiprocessing, sys, time
from pathlib import Path
from embodichain.core.runs.run_lock import RunLock

def work():
    running.set()  # the fork's own handlers (ours among them) have run by now
    time.sleep(30)

lock = RunLock(Path(sys.argv[1]))
lock.acquire()
lock.publish("now")
fork = multiprocessing.get_context("fork")
running = fork.Event()
child = fork.Process(target=work)
child.start()
running.wait(30)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_sigkilled_holder_frees_the_directory_though_its_forked_child_lives(
        tmp_path: Path) -> None:
    """Catches a lock shared with forked children: `resume` right after the OOM killer took a
    trainer with data workers said the directory was in use by the dead trainer's pid."""
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    child = None
    try:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        assert lock_holder(run) == {"host": os.uname().nodename, "pid": holder.pid,
                                    "since": "now"}
        holder.kill()
        holder.wait(timeout=10)
        os.kill(child, 0)  # the child still lives (raises if not)
        assert lock_holder(run) is None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass


# Takes the lock, hands its descriptor to a child that is no fork of it (so nothing lets go
# of it), records itself as the holder and exits: the lock outlives the recorded pid.
ORPHANED = """
import fcntl, os, subprocess, sys
from pathlib import Path
from embodichain.core.runs.run_lock import RunLock

lock = RunLock(Path(sys.argv[1]))
lock.acquire()
lock.publish("then")
fd = lock._file.fileno()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=[fd],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
os._exit(0)
"""


def test_a_lock_outliving_its_recorded_holder_is_named_as_such(tmp_path: Path) -> None:
    """Catches a refusal that calls a dead pid's directory "in use by a live run" and sends
    the user to stop a run that no longer exists."""
    run = tmp_path / "run"
    holder = subprocess.run([sys.executable, "-c", ORPHANED, str(run)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    child = int(holder.stdout)
    try:
        with pytest.raises(RefusedError) as refused:
            RunLock(run).acquire()
        message = str(refused.value)
        assert f"pid {last_holder(run)['pid']} " in message, message
        assert "has ended" in message and "live run" not in message, message
        assert str(run / ".lock") in message, message
    finally:
        os.kill(child, signal.SIGKILL)
