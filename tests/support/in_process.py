"""A short run trained in the test's own process (`load_recipe`, `build_trainer` inside
`distributed_run`, `fit()`, as the programmatic launch does): for tests of what the loop
does at a given update, far cheaper than launching train-sl in a new interpreter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.processes import CPU_RECIPE, FACTORIES, SCRIPTS


def train_in_process(output_dir: Path, changes: Sequence[str], *,
                     edit: Callable[[dict[str, Any]], None] | None = None,
                     before_fit: Callable[[Any], None] | None = None) -> list[Any]:
    """Train sl_ddp's CPU recipe, `edit(recipe)` applied to its YAML mapping, with
    `changes` (`key=value`; tests/factories and tests/scripts importable) to `output_dir`;
    `before_fit(trainer)` runs once the trainer is built.
    Returns every update's `UpdateResult`, in order (read after `fit`, when all settled)."""
    from embodichain.core.training.trainer import SupervisedTrainer
    from embodichain.learning.sl import build_trainer, distributed_run, load_recipe

    raw = yaml.safe_load(CPU_RECIPE.read_text())
    raw["trainer"]["output_dir"] = str(output_dir)
    if edit is not None:
        edit(raw)
    results: list[Any] = []
    update = SupervisedTrainer._update

    def recorded_update(self: SupervisedTrainer, stop: Any) -> Any:
        result = update(self, stop)
        results.append(result)
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FACTORIES))
        patch.syspath_prepend(str(SCRIPTS))
        patch.setattr(SupervisedTrainer, "_update", recorded_update)
        recipe = load_recipe(raw, list(changes))
        with distributed_run(recipe.config.device) as device:
            trainer = build_trainer(recipe, device)
            if before_fit is not None:
                before_fit(trainer)
            trainer.fit(show_progress=False)
    return results
