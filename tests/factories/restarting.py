"""The sl_ddp recipe with test-controlled pace and SIGKILLs, for the recovery-by-restart tests.

Named in recipes as `restarting:build_supervised_trainer` with tests/factories on PYTHONPATH.
Without the variables below it trains exactly like `sl_ddp` (same corpus, model, schema).

- EMBODICHAIN_TEST_SLEEP_S: seconds to sleep in every update (time to send a signal).
- EMBODICHAIN_TEST_KILLS: JSON list of kills, each `{"id", "rank", "update"}` (SIGKILL this
  worker while it computes that update) or `{"id", "rank": 0, "save"}` (SIGKILL rank 0 inside
  the save of that update, after last.pt was replaced and before step_N.pt was). Each kill
  fires once: its id is appended to EMBODICHAIN_TEST_KILL_LOG first, so restarted workers
  (and a rerun of the whole command) skip it.
- EMBODICHAIN_TEST_BLOCK_AT=U with EMBODICHAIN_TEST_BLOCK_FILE=F: rank 0 stops inside update U
  (the other ranks then wait for it in the update's all-reduce), creates F.reached and waits
  until the test creates F: the run is then live at a known update for as long as the test
  needs, however fast or loaded the machine (instead of a pace and a band of updates).
- EMBODICHAIN_TEST_FREEZE_AT=U: rank 1 stops itself with SIGSTOP inside update U (a rank
  frozen as a stuck read or a hung GPU freezes it; the other ranks wait in the all-reduce).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from embodichain.core.checkpoint import writer as writer_module
from embodichain.plugins import sl_ddp


def _pending(kind: str, rank: int, step: int) -> str | None:
    log = Path(os.environ["EMBODICHAIN_TEST_KILL_LOG"])
    done = set(log.read_text().split()) if log.exists() else set()
    for kill in json.loads(os.environ.get("EMBODICHAIN_TEST_KILLS", "[]")):
        if kill["rank"] == rank and kill.get(kind) == step and kill["id"] not in done:
            return kill["id"]
    return None


def _die(kill_id: str, what: str) -> None:
    with open(os.environ["EMBODICHAIN_TEST_KILL_LOG"], "a") as f:
        f.write(f"{kill_id}\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"[test] SIGKILL {kill_id}: {what}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _block(release: Path) -> None:
    reached = release.with_name(release.name + ".reached")
    with open(reached, "w") as f:
        f.flush()
        os.fsync(f.fileno())
    while not release.exists():
        time.sleep(0.02)


def build_supervised_trainer(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    rank = int(os.environ.get("RANK", "0"))
    pause = float(os.environ.get("EMBODICHAIN_TEST_SLEEP_S", "0"))
    objective = trainer.objective

    block_at = int(os.environ.get("EMBODICHAIN_TEST_BLOCK_AT", "0"))
    freeze_at = int(os.environ.get("EMBODICHAIN_TEST_FREEZE_AT", "0"))

    def paced(model, batch):
        if pause:
            time.sleep(pause)
        if block_at and rank == 0 and trainer.step + 1 == block_at:
            _block(Path(os.environ["EMBODICHAIN_TEST_BLOCK_FILE"]))
        if freeze_at and rank == 1 and trainer.step + 1 == freeze_at:
            print(f"[test] SIGSTOP rank 1 in update {freeze_at}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        if "EMBODICHAIN_TEST_KILLS" in os.environ:
            kill = _pending("update", rank, trainer.step + 1)
            if kill:
                _die(kill, f"rank {rank} during update {trainer.step + 1}")
        return objective(model, batch)

    trainer.objective = paced
    if "EMBODICHAIN_TEST_KILLS" in os.environ and rank == 0:
        write = writer_module.write_checkpoint  # in the background writer's thread, too

        def write_then_die(checkpoint, path, *, also_as=None):
            step = checkpoint["manifest"]["step"]
            kill = _pending("save", rank, step) if path.name.startswith("step_") else None
            if kill is None:
                return write(checkpoint, path, also_as=also_as)
            real_replace = os.replace

            def replace(src, dst):
                real_replace(src, dst)
                if Path(dst).name == "last.pt":  # published; step file not yet renamed
                    _die(kill, f"rank 0 inside the save of update {step}")

            os.replace = replace
            try:
                return write(checkpoint, path, also_as=also_as)
            finally:
                os.replace = real_replace

        writer_module.write_checkpoint = write_then_die
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
