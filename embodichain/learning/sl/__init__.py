"""The public supervised-learning API: everything a recipe factory needs.

A factory is `build_supervised_trainer(config, device) -> SupervisedTrainer` with a
`config_schema` attribute describing its own recipe sections; it is registered in the
entry-point group `embodichain.sl_factories` or named as `module.path:attribute`. A factory
whose module imports torch may also register its schema, from a module that does not, in
the group `embodichain.sl_schemas` under the same name: `validate-config` and
`list-factories` then never import torch.

Programs launch a recipe the way `train-sl` does (run directory, claim, lock, resume
rules, signals, summary; docs/api.md):

    recipe = load_recipe("recipe.yaml", overrides=["optimizer.lr=0.01"])
    with distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device)
        final = trainer.fit()

or `train(recipe)` in one call.

Names are imported on first use, so `from embodichain.learning.sl import Section` (the
config types) does not import torch, while `SupervisedTrainer` and friends do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from embodichain.core.checkpoint.file import read_checkpoint, write_checkpoint
    from embodichain.core.data.dataset_source import DatasetSource, file_digest
    from embodichain.core.data.samplers import EpochSampler, ReplacementSampler
    from embodichain.core.data.source import Source, TensorSource, tensor_digest
    from embodichain.core.distributed.process_group import distributed_run
    from embodichain.core.errors import (
        ConfigError,
        DataFormatError,
        Stopped,
        TrainingError,
        UsageError,
    )
    from embodichain.core.evaluation.policy import (
        ClosedLoopPolicy,
        EpisodeJudge,
        MakeJudge,
        MakePolicy,
        Success,
    )
    from embodichain.core.launch.api import build_trainer, load_recipe, train
    from embodichain.core.recipe.data_location import LOCATES_DATA
    from embodichain.core.recipe.evaluation_schema import EnvConfig, EvaluationConfig
    from embodichain.core.recipe.loading import Recipe
    from embodichain.core.recipe.schema import (
        FrameworkConfig,
        OptimizerConfig,
        SchedulerConfig,
        Section,
        TrainerConfig,
    )
    from embodichain.core.training.callbacks import SaveBest, ValidationCallback
    from embodichain.core.training.learner import Learner, UpdateResult
    from embodichain.core.training.model_facts import (
        UnknownSeeds,
        facts_from_checkpoint,
        only_acting,
    )
    from embodichain.core.training.objective import LossResult, Objective
    from embodichain.core.training.trainer import Evaluate, RunContext, SupervisedTrainer

_HOMES = {
    "embodichain.core.training.callbacks": ("SaveBest", "ValidationCallback"),
    "embodichain.core.checkpoint.file": ("read_checkpoint", "write_checkpoint"),
    "embodichain.core.recipe.schema": ("FrameworkConfig", "OptimizerConfig", "SchedulerConfig",
                                "Section", "TrainerConfig"),
    "embodichain.core.data.dataset_source": ("DatasetSource", "file_digest"),
    "embodichain.core.data.samplers": ("EpochSampler", "ReplacementSampler"),
    "embodichain.core.distributed.process_group": ("distributed_run",),
    "embodichain.core.evaluation.policy": ("ClosedLoopPolicy", "EpisodeJudge", "MakeJudge",
                                           "MakePolicy", "Success"),
    "embodichain.core.recipe.evaluation_schema": ("EnvConfig", "EvaluationConfig"),
    "embodichain.core.errors": ("ConfigError", "DataFormatError", "Stopped", "TrainingError",
                                "UsageError"),
    "embodichain.core.launch.api": ("build_trainer", "load_recipe", "train"),
    "embodichain.core.recipe.loading": ("Recipe",),
    "embodichain.core.recipe.data_location": ("LOCATES_DATA",),
    "embodichain.core.training.learner": ("Learner", "UpdateResult"),
    "embodichain.core.training.model_facts": ("UnknownSeeds", "facts_from_checkpoint",
                                              "only_acting"),
    "embodichain.core.training.objective": ("LossResult", "Objective"),
    "embodichain.core.data.source": ("Source", "TensorSource", "tensor_digest"),
    "embodichain.core.training.trainer": ("Evaluate", "RunContext", "SupervisedTrainer"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [  # the names of _HOMES, spelled out for linters and type checkers
    "ClosedLoopPolicy",
    "EpisodeJudge",
    "MakeJudge",
    "EnvConfig",
    "EvaluationConfig",
    "MakePolicy",
    "Success",
    "ConfigError",
    "DataFormatError",
    "DatasetSource",
    "EpochSampler",
    "Evaluate",
    "FrameworkConfig",
    "LOCATES_DATA",
    "Learner",
    "LossResult",
    "Objective",
    "OptimizerConfig",
    "Recipe",
    "ReplacementSampler",
    "RunContext",
    "SaveBest",
    "SchedulerConfig",
    "Section",
    "Source",
    "Stopped",
    "SupervisedTrainer",
    "TensorSource",
    "TrainerConfig",
    "TrainingError",
    "UnknownSeeds",
    "UpdateResult",
    "UsageError",
    "ValidationCallback",
    "build_trainer",
    "distributed_run",
    "facts_from_checkpoint",
    "file_digest",
    "load_recipe",
    "only_acting",
    "read_checkpoint",
    "tensor_digest",
    "train",
    "write_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
