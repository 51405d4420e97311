"""The public supervised-learning API: everything a recipe factory needs.

A factory is `build_supervised_trainer(config, device) -> SupervisedTrainer` with a
`config_schema` attribute describing its own recipe sections; it is registered in the
entry-point group `embodichain.sl_factories` or named as `module.path:attribute`.
"""

from embodichain.core.callbacks import SaveBest, ValidationCallback
from embodichain.core.checkpoint import read_checkpoint, write_checkpoint
from embodichain.core.config import (
    FrameworkConfig,
    OptimizerConfig,
    SchedulerConfig,
    Section,
    TrainerConfig,
)
from embodichain.core.distributed import distributed_run
from embodichain.core.errors import ConfigError, UsageError
from embodichain.core.learner import Learner
from embodichain.core.objective import LossResult, Objective
from embodichain.core.source import ReplacementSampler, Source, TensorSource, tensor_digest
from embodichain.core.trainer import Evaluate, RunContext, SupervisedTrainer

__all__ = [
    "ConfigError",
    "Evaluate",
    "FrameworkConfig",
    "Learner",
    "LossResult",
    "Objective",
    "OptimizerConfig",
    "ReplacementSampler",
    "RunContext",
    "SaveBest",
    "SchedulerConfig",
    "Section",
    "Source",
    "SupervisedTrainer",
    "TensorSource",
    "TrainerConfig",
    "UsageError",
    "ValidationCallback",
    "distributed_run",
    "read_checkpoint",
    "tensor_digest",
    "write_checkpoint",
]
