"""Run `embodichain ARGS` as this torchrun worker's child and record the code it exits with.

    torchrun --nproc-per-node=2 -m exit_code_recorder OUT -- train-sl ...

For the signal tests, which need each worker's own exit code: a worker stopped by SIGINT
that torchrun forwards is in no failure report (the agent itself was interrupted), and when
one worker exits first, torchrun SIGTERMs the others, so its report may show a worker that
was about to exit 143 by itself as -15. So the command runs in its own session, out of reach
of torchrun's SIGTERM (ignored here); SIGINT, which the agent forwards from the user, is
passed on to it. Its exit code goes to `OUT/exit_rank{RANK}` and becomes this process's own.
A test signals the command itself as this process's only child. In a warm worker (torch
imported already: tests/support/warm_python.py) the command is forked rather than started
afresh, as the warm interpreter forks a launch; elsewhere it is a new interpreter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class _Forked:
    """What `main` uses of a `Popen`, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self) -> int:
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _start(args: list[str]) -> subprocess.Popen | _Forked:
    """`python -m embodichain ARGS` in a session of its own."""
    if "torch" not in sys.modules:
        return subprocess.Popen([sys.executable, "-m", "embodichain", *args],
                                start_new_session=True)
    import runpy

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return _Forked(pid)
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.modules["torch"].default_generator.seed()  # a fresh process draws its own seed
    sys.argv = ["embodichain", *args]
    # What it raises (SystemExit included) ends this process as it ends a fresh one.
    runpy.run_module("embodichain", run_name="__main__", alter_sys=True)
    sys.exit(0)


def main() -> int:
    out, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: exit_code_recorder OUT -- ARGS..."
    signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler: reset in the child
    child = _start(args)
    signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    code = child.wait()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"exit_rank{os.environ['RANK']}").write_text(str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    # Not through the interpreter's shutdown: it restores SIGTERM's default action first, and
    # in a warm worker (torch imported) it lasts long enough for torchrun's SIGTERM, sent once
    # the other rank has exited, to end this process as -15 instead of the command's code.
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
