"""sl_ddp whose model first max-pools its 4 inputs in pairs and unpools them back (the
smaller of each pair zeroed): `max_unpool1d` has no deterministic implementation in torch,
on CPU as on CUDA, so `trainer.deterministic: true` refuses it at the first forward.

Named in recipes as `unpooling:build_supervised_trainer` with tests/factories on PYTHONPATH.
"""

from __future__ import annotations

from torch import nn
from torch.nn import functional

from embodichain.learning.sl import SupervisedTrainer
from embodichain.plugins import sl_ddp


class KeepPairMaxima(nn.Module):
    def forward(self, x):
        pooled, indices = functional.max_pool1d(x.unsqueeze(1), 2, return_indices=True)
        return functional.max_unpool1d(pooled, indices, 2, output_size=x.unsqueeze(1).shape
                                       ).squeeze(1)


def build_supervised_trainer(config, device):
    built = sl_ddp.build_supervised_trainer(config, device)
    return SupervisedTrainer(
        config, model=nn.Sequential(KeepPairMaxima(), built.model), source=built.source,
        objective=built.objective, device=device, evaluate=built.evaluate)


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
