"""Helpers of the data tests: recipes of the augmenting factory, its environment."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import FACTORIES, worker_env
from tests.support.recipes import write_recipe

AUGMENTING = {"factory": "augmenting:build_supervised_trainer", "trainer.max_updates": 40,
              "trainer.save_every": 20, "trainer.validate_every": 20, "trainer.log_every": 5,
              "data.train_size": 1024}


def data_env(**extra: str) -> dict[str, str]:
    return worker_env(PYTHONPATH=str(FACTORIES), **extra)


def data_recipe(path: Path, run: Path, **changes: object) -> Path:
    return write_recipe(path, run, **{**AUGMENTING, **changes})
