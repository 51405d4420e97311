"""The `sl_ddp` recipe's own sections, in a module without torch.

Registered in the entry-point group `embodichain.sl_schemas`, so that `validate-config` and
`list-factories` check an `sl_ddp` recipe without importing torch (the factory's module,
`embodichain.plugins.sl_ddp`, imports it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, PositiveInt

from embodichain.learning.sl import Section


class ModelConfig(Section):
    hidden: PositiveInt = 32


class DataConfig(Section):
    train_size: PositiveInt = 4096
    val_size: PositiveInt = 1024
    seed: int = 1234


class SlDdpConfig(BaseModel):
    """Recipe-owned sections of `sl_ddp`."""

    model_config = ConfigDict(extra="forbid")
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
