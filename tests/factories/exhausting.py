"""The sl_ddp recipe whose objective raises torch's out-of-memory error at update
EMBODICHAIN_TEST_OOM_AT (as CUDA's allocator does when a batch does not fit), so that the
message a user gets is tested on the CPU. Without the variable it trains like `sl_ddp`."""

from __future__ import annotations

import os

import torch

from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    at = int(os.environ.get("EMBODICHAIN_TEST_OOM_AT", "0"))
    objective = trainer.objective

    def exhausting(model, batch):
        if at and trainer.step + 1 == at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. "
                                         "GPU 0 has a total capacity of 79.19 GiB")
        return objective(model, batch)

    trainer.objective = exhausting
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
