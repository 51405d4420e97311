"""The sl_ddp recipe with its corpus left in host memory (`TensorSource` on the CPU) whatever
the device: on CUDA each batch is gathered on the host and copied to the device, the path
the loader prefetches (core/data/loader.py). Without validation (no `evaluate`).

Named in recipes as `host_resident:build_supervised_trainer` with tests/factories on
PYTHONPATH.
"""

from __future__ import annotations

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp
from embodichain.plugins.sl_ddp_schema import SlDdpConfig


def build_supervised_trainer(config, device):
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    return SupervisedTrainer(config, model=sl_ddp.make_model(config.model.hidden),
                             source=source, objective=sl_ddp.masked_mse, device=device)


build_supervised_trainer.config_schema = SlDdpConfig
