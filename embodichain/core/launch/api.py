"""The programmatic launch (R-API-1): load and check a recipe, build its trainer, fit.

    recipe = load_recipe("recipe.yaml", overrides=["optimizer.lr=0.01"])
    with distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device)
        final = trainer.fit()

is what `train-sl` runs (the CLI is a thin user of these functions): the same checks
before anything starts, the same run directory, claim, lock and resume rules, signals and
summary, and so the same model, bitwise. `train(recipe)` does the three steps in one call.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embodichain.core.recipe.loading import (
    Recipe,
    for_world_size,
    known_world_size,
    validate_recipe,
)
from embodichain.core.recipe.loading import load_recipe as load_recipe_file
from embodichain.core.recipe.machine_limits import refuse_or_warn
from embodichain.core.runs.commands import SELF_LAUNCHED
from embodichain.core.runs.resume_policy import Start

if TYPE_CHECKING:  # torch is imported only when training starts
    from embodichain.core.checkpoint.initial_weights import InitFrom

Resume = str | Path | None
"""None: a fresh run; "auto": fresh when output_dir holds no run, else continue it; a
checkpoint file or run directory: continue from it (as `train-sl --resume`)."""


def load_recipe(recipe: str | Path | Mapping[str, Any], overrides: Sequence[str] = (), *,
                source: str | None = None, local_ranks: int | None = None, warn: bool = True
                ) -> Recipe:
    """A validated recipe from a YAML file or a mapping, after `KEY=VALUE` overrides.

    Raises ConfigError (a UsageError, exit code 2) naming every problem: the schemas, the
    keys that need each other, and the sizes this machine cannot serve for `local_ranks`
    training processes on it (default: LOCAL_WORLD_SIZE, else 1). Keys without effect and
    large sizes are warned about once (rank 0, logger `embodichain`) unless `warn` is
    false; they are in `Recipe.warnings` either way. `source` names a mapping's origin in
    messages (a file names itself).
    """
    if isinstance(recipe, Mapping):
        loaded = validate_recipe(recipe, source=source, overrides=overrides)
    else:
        loaded = load_recipe_file(recipe, overrides)
    ranks = local_ranks or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    loaded = for_world_size(loaded, known_world_size(local_ranks) or ranks)  # R-ELASTIC-1
    machine = refuse_or_warn(loaded.config, loaded.source, ranks)
    loaded = dataclasses.replace(loaded, warnings=(*loaded.warnings, *machine))
    if warn and int(os.environ.get("RANK", "0")) == 0 and not os.environ.get(SELF_LAUNCHED):
        for warning in loaded.warnings:
            logging.getLogger("embodichain").warning("warning: %s", warning)
    return loaded


def start_of(resume: Resume) -> Start:
    """The `Start` a `resume` value asks for (see `Resume`). Only rank 0 reads the
    checkpoint (other nodes need not have it), so nothing is checked here."""
    if resume is None:
        return Start()
    if str(resume) == "auto":
        return Start("auto")
    return Start("checkpoint", Path(resume))


def train(recipe: Recipe, *, resume: Resume = None, show_progress: bool = True,
          init_from: InitFrom | None = None) -> dict[str, float]:
    """Build the recipe's trainer on every rank and fit it, as `train-sl` does; returns the
    final metrics (`{}` when the run was already complete). Raises `Stopped` after the
    snapshot of a stop signal (its `exit_code` is 130 / 143), UsageError for a refusal
    (exit 2) and TrainingError for a failure (exit 1). `init_from` (as `train-sl
    --init-from`): a new run whose model starts from those weights; not with `resume`."""
    from embodichain.core.launch.train import train as train_run

    return train_run(recipe, start=start_of(resume), show_progress=show_progress,
                     init_from=init_from)


def build_trainer(recipe: Recipe, device: Any, *, resume: Resume = None,
                  init_from: InitFrom | None = None) -> Any:
    """The recipe's trainer, built by its factory on this rank (inside `distributed_run`,
    on every rank), with the model initialised from `seed` as train-sl initialises it.
    Its `fit()` runs as train-sl's: the run directory fresh or continued by `resume`, the
    lock, signals and summary; the trainer is closed when it returns. `init_from`: as
    for `train`."""
    from embodichain.core.launch.train import build_trainer as build

    return build(recipe, device, start=start_of(resume), init_from=init_from)
