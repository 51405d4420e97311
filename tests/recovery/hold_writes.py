"""`python -m hold_writes ARGS...`: run `embodichain ARGS...` with background saves held at a
known point, so that tests of `trainer.async_save` never depend on timing.

What to do comes from `$EMBODICHAIN_TEST_HOLD` (JSON); events are appended, one JSON object a
line, to `$EMBODICHAIN_TEST_HOLD_LOG` (one file per rank: `.rank{R}` is added). Installed by
wrapping functions in this process only; product code has no hooks:

- `{"behind": n}`: every background write waits, before it starts, until the training thread
  has run n more updates (or waits for that write itself: at the next save or the end). The
  saved state must still be the boundary's, although training moved on before it was read.
- `{"until_signal": K}`: the background write of the step-K file waits until this process
  has received a stop signal (logged `in_flight` first, so a test knows when to send it).
- `{"log_saves": true}`: every rank logs each `trainer.save` call (step, file, time).
- `{"kill_at": U}`: rank 0 SIGKILLs itself just before its U-th update (logged first).
- `{"drain_before": U}`: rank 0's U-th update first waits until no background write is
  running (a failed one has then been noted by the writer).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

HOLD_ENV = "EMBODICHAIN_TEST_HOLD"
LOG_ENV = "EMBODICHAIN_TEST_HOLD_LOG"
RANK = int(os.environ.get("RANK", "0"))


def log(event: dict[str, Any]) -> None:
    with open(f"{os.environ[LOG_ENV]}.rank{RANK}", "a") as f:
        f.write(json.dumps({**event, "rank": RANK, "t": time.monotonic(),
                            "thread": threading.current_thread().name}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def install(hold: dict[str, Any]) -> None:
    from embodichain.core.checkpoint import writer
    from embodichain.core.distributed.stop_request import StopRequest
    from embodichain.core.training.learner import Learner
    from embodichain.core.training.trainer import SupervisedTrainer

    changed = threading.Condition()
    state = {"updates": 0, "settling": 0, "signalled": False}

    real_update = Learner.update

    def update(self, *args, **kwargs):
        if hold.get("kill_at") == state["updates"] + 1 and RANK == 0:
            log({"event": "killed", "before_update": state["updates"] + 1})
            os.kill(os.getpid(), signal.SIGKILL)
        if hold.get("drain_before") == state["updates"] + 1 and RANK == 0:
            while any(t.name.startswith("embodichain-save-") for t in threading.enumerate()):
                time.sleep(0.01)
            log({"event": "drained", "before_update": state["updates"] + 1})
        result = real_update(self, *args, **kwargs)
        with changed:
            state["updates"] += 1
            changed.notify_all()
        return result

    real_settle = writer.CheckpointWriter.settle

    def settle(self):
        with changed:
            state["settling"] += 1
            changed.notify_all()
        try:
            return real_settle(self)
        finally:
            with changed:
                state["settling"] -= 1

    real_handle = StopRequest._handle

    def handle(self, signum, frame):
        with changed:
            state["signalled"] = True
            changed.notify_all()
        return real_handle(self, signum, frame)

    real_run = writer.FileSave.run

    def run(self):
        step, path = self.payload["run"]["step"], self.path
        if threading.current_thread() is not threading.main_thread():
            with changed:
                if "behind" in hold:
                    start = state["updates"]
                    changed.wait_for(lambda: state["updates"] >= start + hold["behind"]
                                     or state["settling"])
                    log({"event": "write", "step": step, "file": path.name,
                         "updates_behind": state["updates"] - start})
                if hold.get("until_signal") == step and path.name.startswith("step_"):
                    log({"event": "in_flight", "step": step, "file": path.name})
                    changed.wait_for(lambda: state["signalled"])
                    log({"event": "released", "step": step, "file": path.name,
                         "updates": state["updates"]})
        result = real_run(self)
        if hold.get("until_signal") is not None:
            log({"event": "published", "step": step, "file": path.name})
        return result

    real_save = SupervisedTrainer.save

    def save(self, path):
        if hold.get("log_saves"):
            log({"event": "save", "step": self.step, "file": os.path.basename(str(path))})
        return real_save(self, path)

    Learner.update = update
    writer.CheckpointWriter.settle = settle
    StopRequest._handle = handle
    writer.FileSave.run = run
    SupervisedTrainer.save = save


def main() -> None:
    install(json.loads(os.environ[HOLD_ENV]))
    from embodichain.cli import main as cli

    sys.argv = ["embodichain", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
