"""A recipe factory (named as `zero_weight_factory:build_supervised_trainer`) whose batches can
carry no supervised target at all: the `sl_ddp` corpus with every example where x_2 > 0
unsupervised. With one example per worker, some global batches have zero total weight.
"""

from __future__ import annotations

import torch

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


def corpus(size: int, seed: int) -> dict[str, torch.Tensor]:
    data = sl_ddp.make_corpus(size, seed)
    data["mask"] = data["mask"] * (data["x"][:, 2:3] <= 0).float()
    return data


def build_supervised_trainer(config: sl_ddp.SlDdpConfig, device: torch.device
                             ) -> SupervisedTrainer:
    source = TensorSource(corpus(config.data.train_size, config.data.seed)).to(device)
    return SupervisedTrainer(
        config,
        model=sl_ddp.make_model(config.model.hidden),
        source=source,
        objective=sl_ddp.masked_mse,
        device=device,
    )


build_supervised_trainer.config_schema = sl_ddp.SlDdpConfig
