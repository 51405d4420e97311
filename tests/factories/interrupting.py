"""The sl_ddp recipe, but the process dies at update EMBODICHAIN_TEST_FAIL_AT (an interruption).

Named in recipes as `interrupting:build_supervised_trainer` with tests/factories on
PYTHONPATH. Without the variable it trains exactly like `sl_ddp`. With
EMBODICHAIN_TEST_FAIL_RANK=R only rank R fails (the others then wait in the update's
collective for a peer that is gone).
"""

from __future__ import annotations

import os

from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    fail_at = int(os.environ.get("EMBODICHAIN_TEST_FAIL_AT", "0"))
    only = os.environ.get("EMBODICHAIN_TEST_FAIL_RANK")
    if only is not None and os.environ.get("RANK", "0") != only:
        fail_at = 0
    objective = trainer.objective

    def interrupted(model, batch):
        if fail_at and trainer.step + 1 == fail_at:
            raise RuntimeError(f"simulated crash at update {fail_at}")
        return objective(model, batch)

    trainer.objective = interrupted
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
