"""The sl_ddp recipe whose schema grows a key: a factory upgraded after checkpoints existed.

Named in recipes as `growing:build_supervised_trainer` with tests/factories on PYTHONPATH.
With EMBODICHAIN_TEST_GROWN_SCHEMA set when the module is imported, its `data` section has
one key more, `data.train_episodes` (default 0: every example, the behaviour before the key;
this test factory trains the same for any value, only the resume rule looks at it). Without
the variable it is exactly `sl_ddp`'s schema.
"""

from __future__ import annotations

import os

from pydantic import NonNegativeInt

from embodichain.plugins import sl_ddp
from embodichain.plugins.sl_ddp_schema import DataConfig, SlDdpConfig

GROWN = bool(os.environ.get("EMBODICHAIN_TEST_GROWN_SCHEMA"))


class GrownDataConfig(DataConfig):
    train_episodes: NonNegativeInt = 0


class GrownConfig(SlDdpConfig):
    data: GrownDataConfig = GrownDataConfig()


def build_supervised_trainer(config, device):
    return sl_ddp.build_supervised_trainer(config, device)


build_supervised_trainer.config_schema = GrownConfig if GROWN else SlDdpConfig
