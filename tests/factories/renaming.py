"""The sl_ddp recipe in two releases of its factory: 0.1, and 0.2, which renamed a module.

Named in recipes as `renaming:build_supervised_trainer` with tests/factories on PYTHONPATH.
With EMBODICHAIN_TEST_RENAMED set when the module is imported, this is release 0.2: the
output layer that 0.1 called `head` is called `action_head` (the same shape, so every
tensor of a 0.1 checkpoint has a place, under another name). The release is this
package's own `__version__` (a factory outside any installed distribution declares it
there; run.json, each checkpoint and each `resumed` event record it).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp
from embodichain.plugins.sl_ddp_schema import SlDdpConfig

RENAMED = bool(os.environ.get("EMBODICHAIN_TEST_RENAMED"))
__version__ = "0.2" if RENAMED else "0.1"


class Policy(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, hidden), nn.Tanh())
        head = nn.Linear(hidden, 2)
        if RENAMED:
            self.action_head = head
        else:
            self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.action_head if RENAMED else self.head
        return head(self.body(x))


def build_supervised_trainer(config: SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    return SupervisedTrainer(config, model=Policy(config.model.hidden), source=source.to(device),
                             objective=sl_ddp.masked_mse, device=device)


build_supervised_trainer.config_schema = SlDdpConfig
