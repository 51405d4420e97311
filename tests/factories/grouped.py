"""The sl_ddp recipe with factory parameter groups (R-LOOP-3): the first layer trains at a
tenth of the learning rate with its own weight decay, the rest with the recipe's.

Named in recipes as `grouped:build_supervised_trainer` with tests/factories on PYTHONPATH.
"""

from __future__ import annotations

from embodichain.learning.sl import SupervisedTrainer
from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    built = sl_ddp.build_supervised_trainer(config, device)
    model = built.model
    return SupervisedTrainer(
        config, model=model, source=built.source, objective=built.objective, device=device,
        evaluate=built.evaluate,
        param_groups=[{"name": "first", "params": model[0].parameters(), "lr_scale": 0.1,
                       "weight_decay": 0.5}])


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
