"""The sl_ddp factory whose `evaluate` raises on one rank only (`failing_validation:on_rank_one`).

Under `trainer.strategy: fsdp` every rank runs `evaluate` (the sharded forward is
collective): rank 1 fails after its forward, so rank 0 has left the forward's collectives
and waits for rank 1 in the next collective.
"""

from __future__ import annotations

import os

from embodichain.plugins import sl_ddp


def on_rank_one(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    evaluate = trainer.evaluate

    def failing(model, device):
        metrics = evaluate(model, device)
        if os.environ.get("RANK") == "1":
            raise ValueError("the validation corpus of rank 1 is unreadable")
        return metrics

    trainer.evaluate = failing
    return trainer


on_rank_one.config_schema = sl_ddp.build_supervised_trainer.config_schema
