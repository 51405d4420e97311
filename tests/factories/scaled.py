"""The sl_ddp recipe whose first layer's learning-rate scale comes from the recipe
(`groups: {first_lr_scale: S}`), passed on as a factory parameter group: only building the
trainer can tell a bad scale.

Named in recipes as `scaled:build_supervised_trainer` with tests/factories on PYTHONPATH.
"""

from __future__ import annotations

from embodichain.learning.sl import Section, SupervisedTrainer
from embodichain.plugins import sl_ddp
from embodichain.plugins.sl_ddp_schema import SlDdpConfig


class Groups(Section):
    first_lr_scale: float = 0.1


class ScaledConfig(SlDdpConfig):
    groups: Groups = Groups()


def build_supervised_trainer(config, device):
    built = sl_ddp.build_supervised_trainer(config, device)
    model = built.model
    return SupervisedTrainer(
        config, model=model, source=built.source, objective=built.objective, device=device,
        evaluate=built.evaluate,
        param_groups=[{"name": "first", "params": model[0].parameters(),
                       "lr_scale": config.groups.first_lr_scale}])


build_supervised_trainer.config_schema = ScaledConfig
