"""A factory for the activation checkpointing tests: sl_ddp's corpus and objective on a
4 -> hidden -> 2 network of two residual `DropoutBlock`s (layer norm, GELU MLP, dropout), so
that a recomputed forward must draw the same dropout masks as the first one. The blocks are
also FSDP2's shard groups (`shard_blocks`; ignored under ddp): the checkpointed modules are
the sharded ones, as in a transformer.

Named in recipes as `dropout_blocks:build_supervised_trainer` with tests/factories on
PYTHONPATH; `model.hidden` sets the width.
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


class DropoutBlock(nn.Module):
    """`x + dropout(W2 gelu(W1 norm(x)))`."""

    def __init__(self, width: int, p: float = 0.25) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


def make_model(hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, hidden), DropoutBlock(hidden), DropoutBlock(hidden),
                         nn.Linear(hidden, 2))


def build_supervised_trainer(config, device):
    model = make_model(config.model.hidden)
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed)).to(device)
    validation = {k: v.to(device) for k, v in sl_ddp.make_corpus(256, 7).items()}

    def evaluate(model, device):
        return {"validation/mse": sl_ddp.masked_mse(model, validation).loss.item()}

    return SupervisedTrainer(config, model=model, source=source, objective=sl_ddp.masked_mse,
                             device=device, evaluate=evaluate, shard_blocks=[model[1], model[2]])


build_supervised_trainer.config_schema = sl_ddp.SlDdpConfig
