"""The sl_ddp recipe whose objective runs out of memory at update EMBODICHAIN_TEST_OOM_AT:
on CUDA it asks the allocator for twice the device; on the CPU it raises torch's error as
CUDA's allocator would, so that the message a user gets is tested there too. Without the
variable it trains like `sl_ddp`."""

from __future__ import annotations

import os

import torch

from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)
    at = int(os.environ.get("EMBODICHAIN_TEST_OOM_AT", "0"))
    objective = trainer.objective

    def exhausting(model, batch):
        if at and trainer.step + 1 == at and device.type == "cuda":  # the allocator's own
            total = torch.cuda.get_device_properties(device).total_memory
            torch.empty(2 * total, dtype=torch.uint8, device=device)
        if at and trainer.step + 1 == at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. "
                                         "GPU 0 has a total capacity of 79.19 GiB")
        return objective(model, batch)

    trainer.objective = exhausting
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
