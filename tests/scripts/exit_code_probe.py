"""Run one torchrun worker's real command and record the exit code that worker chose.

    torchrun --nproc-per-node=2 -m exit_code_probe OUT -- -m embodichain train-sl ...

When one worker fails, torchrun terminates the others (SIGTERM to their process group), so
its report may show a worker that was still shutting down as -15 rather than the code it was
about to exit with. The command runs here in its own session, with this worker's environment
(RANK, WORLD_SIZE, MASTER_ADDR, ...), out of reach of that signal; its exit code goes to
`OUT/exit_rank{RANK}` and becomes this process's own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def main() -> int:
    out, separator, *command = sys.argv[1:]
    assert separator == "--", "usage: exit_code_probe OUT -- ARGS..."
    signal.signal(signal.SIGTERM, lambda *_: None)  # a Python handler: reset in the child
    code = subprocess.call([sys.executable, *command], start_new_session=True)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"exit_rank{os.environ['RANK']}").write_text(str(code))
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
