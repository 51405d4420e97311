"""The run directory's lock ends with the process that took it, not with its forked children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from embodichain.core.runs.run_lock import lock_holder
from tests.support.processes import REPO

# Takes the lock, forks a child that outlives it (as a DataLoader worker outlives a SIGKILLed
# trainer until it notices), prints the child's pid and waits to be killed. Bounded: the child
# sleeps 30 s at most, the holder 60 s.
HOLDER = """
import multiprocessing, sys, time
from pathlib import Path
from embodichain.core.runs.run_lock import RunLock

lock = RunLock(Path(sys.argv[1]))
lock.acquire()
lock.publish("now")
child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
child.start()
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
