"""The sl_ddp factory whose `evaluate` raises on one rank only.

Under `trainer.strategy: fsdp` every rank runs `evaluate` (the sharded forward is
collective). `on_rank_one`: rank 1 fails after its forward, so rank 0 has left the
forward's collectives and waits for rank 1 in the next collective.
`before_forward_on_rank_one`: rank 1 fails before its forward, so rank 0 waits for it inside
the forward's all-gather; rank 1 first writes the wall time of its failure (`time.time()`)
to `$FAILED_AT_FILE` when that is set. `everywhere`: every rank's `evaluate` raises.
"""

from __future__ import annotations

import os
import time

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


def before_forward_on_rank_one(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    evaluate = trainer.evaluate

    def failing(model, device):
        if os.environ.get("RANK") == "1":
            if os.environ.get("FAILED_AT_FILE"):
                with open(os.environ["FAILED_AT_FILE"], "w") as f:
                    f.write(repr(time.time()))
            raise ValueError("the validation corpus of rank 1 is unreadable")
        return evaluate(model, device)

    trainer.evaluate = failing
    return trainer


on_rank_one.config_schema = sl_ddp.build_supervised_trainer.config_schema
before_forward_on_rank_one.config_schema = sl_ddp.build_supervised_trainer.config_schema


def everywhere(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)

    def failing(model, device):
        raise ValueError("the validation corpus is unreadable")

    trainer.evaluate = failing
    return trainer
everywhere.config_schema = sl_ddp.build_supervised_trainer.config_schema
