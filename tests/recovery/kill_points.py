"""`python -m kill_points ARGS...`: run `embodichain ARGS...`, which SIGKILLs itself at one point.

The point comes from `$EMBODICHAIN_TEST_KILL_POINT` (JSON) and is installed by wrapping, in
this process only, the function that enters the critical window; product code has no hooks:

- `{"at": "replace", "name": N, "nth": n}`: just before the n-th (default first)
  `os.replace(src, dst)` with `dst` named N (a checkpoint save replaces `last.pt`, then
  renames `step_K.pt`; a run.json update replaces `run.json`);
- `{"at": "unlink", "name": N}`: just before `Path.unlink` of a file named N (keep_last);
- `{"at": "capture", "step": K}`: when the trainer captures the state to save at update K.

`"rank": R` (default 0) picks the torchrun worker that dies; the others run unchanged. Just
before dying, the process records what it was about to do in `$EMBODICHAIN_TEST_KILL_MARK`
(fsynced), with the thread that was doing it, so a test can assert that the kill landed
inside its window.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

POINT_ENV = "EMBODICHAIN_TEST_KILL_POINT"
MARK_ENV = "EMBODICHAIN_TEST_KILL_MARK"


def _die(what: dict[str, Any]) -> None:
    # the thread: a background checkpoint write (trainer.async_save) or the training loop
    what = {**what, "thread": threading.current_thread().name}
    with open(os.environ[MARK_ENV], "w") as f:
        json.dump(what, f)
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: dict[str, Any]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    if rank != point.get("rank", 0):
        return
    at = point["at"]
    seen = [0]
    if at == "replace":
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if Path(dst).name == point["name"]:
                seen[0] += 1
            if Path(dst).name == point["name"] and seen[0] == point.get("nth", 1):
                _die({"at": at, "src": str(src), "dst": str(dst), "rank": rank,
                      "src_exists": Path(src).is_file(), "dst_exists": Path(dst).exists()})
            return real_replace(src, dst, *args, **kwargs)

        os.replace = replace
    elif at == "unlink":
        real_unlink = Path.unlink

        def unlink(self, *args, **kwargs):
            if self.name == point["name"]:
                _die({"at": at, "path": str(self), "rank": rank, "exists": self.exists()})
            return real_unlink(self, *args, **kwargs)

        Path.unlink = unlink
    elif at == "capture":
        from embodichain.core.training.checkpointing import Checkpointing

        real_snapshot = Checkpointing._snapshot  # where a save captures this rank's state

        def snapshot(self, trainer, *args, **kwargs):
            if trainer.step == point["step"]:
                _die({"at": at, "step": trainer.step, "rank": rank})
            return real_snapshot(self, trainer, *args, **kwargs)

        Checkpointing._snapshot = snapshot
    else:
        raise ValueError(f"unknown kill point {point!r}")


def main() -> None:
    install(json.loads(os.environ[POINT_ENV]))
    from embodichain.cli import main as cli

    sys.argv = ["embodichain", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
