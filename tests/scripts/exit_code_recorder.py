"""Run `embodichain ARGS` in this torchrun worker and record the exit code it chose.

    torchrun --nproc-per-node=2 -m exit_code_recorder OUT -- train-sl ...

A worker stopped by a signal that torchrun forwards (SIGINT to the agent) is not in
torchrun's failure report: the agent itself was interrupted. The command runs here, in this
process (so signals reach embodichain's own handlers as they would), and the code it exits
with goes to `OUT/exit_rank{RANK}` before this process exits with it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> int:
    out, separator, *args = sys.argv[1:]
    assert separator == "--", "usage: exit_code_recorder OUT -- ARGS..."
    from embodichain.cli import main as cli

    sys.argv = ["embodichain", *args]
    try:
        cli()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"exit_rank{os.environ['RANK']}").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
