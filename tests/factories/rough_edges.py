"""Factories as a newcomer writes them on a first try, for the rough-edge tests (issue 17).

Named in recipes as `rough_edges:NAME` with tests/factories on PYTHONPATH:
- `no_schema`: the sl_ddp factory without a `config_schema` (so `model:` has no home);
- `bare_tensor`: an objective that returns the loss tensor instead of a LossResult.
"""

from __future__ import annotations

from embodichain.plugins import sl_ddp


def no_schema(config, device):
    return sl_ddp.build_supervised_trainer(config, device)


def bare_tensor(config, device):
    trainer = sl_ddp.build_supervised_trainer(config, device)

    def objective(model, batch):
        return sl_ddp.masked_mse(model, batch).loss  # forgot LossResult

    trainer.objective = objective
    return trainer


bare_tensor.config_schema = sl_ddp.build_supervised_trainer.config_schema
