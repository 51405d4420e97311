"""The sl_ddp recipe, but every rank waits at one update until the test lets it go.

Named in recipes as `blocking:build_supervised_trainer` with tests/factories on PYTHONPATH.
Without the variables it trains exactly like `sl_ddp` (same corpus, model and schema).

- EMBODICHAIN_TEST_BLOCK_AT: the update (1-based) at which each rank waits, before computing
  it; the rank first creates `$EMBODICHAIN_TEST_BLOCK_FILE.rank{R}` (so the test knows
  where every rank is) and then waits until `$EMBODICHAIN_TEST_BLOCK_FILE` exists.

- EMBODICHAIN_TEST_PACE_S: seconds every later update sleeps (so that a run that failed to
  stop would still be training long after the test's deadline).

- EMBODICHAIN_TEST_SLOW_VALIDATION_S: seconds rank 0's validation at update
  EMBODICHAIN_TEST_SLOW_VALIDATION_AT takes (it first creates `$EMBODICHAIN_TEST_BLOCK_FILE
  .validating`), while the other ranks wait for it.

Kill timing is then exact: whatever the test does while the ranks wait happens "before
update N", and the stop that follows lands at update N.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    block_at = int(os.environ.get("EMBODICHAIN_TEST_BLOCK_AT", "0"))
    release = Path(os.environ.get("EMBODICHAIN_TEST_BLOCK_FILE", "unused"))
    pace = float(os.environ.get("EMBODICHAIN_TEST_PACE_S", "0"))
    rank = int(os.environ.get("RANK", "0"))
    objective = trainer.objective

    def blocking(model, batch):
        if block_at and trainer.step + 1 == block_at:
            Path(f"{release}.rank{rank}").touch()
            while not release.exists():
                time.sleep(0.02)
        elif block_at and trainer.step + 1 > block_at:
            time.sleep(pace)
        return objective(model, batch)

    trainer.objective = blocking
    slow_s = float(os.environ.get("EMBODICHAIN_TEST_SLOW_VALIDATION_S", "0"))
    slow_at = int(os.environ.get("EMBODICHAIN_TEST_SLOW_VALIDATION_AT", "0"))
    evaluate = trainer.evaluate

    def slow_evaluate(model, device):
        if trainer.step == slow_at:
            Path(f"{release}.validating").touch()
            time.sleep(slow_s)
        return evaluate(model, device)

    if slow_s:
        trainer.evaluate = slow_evaluate
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
