"""Validation callbacks. They run on rank 0 after each validation (R-VAL-1, R-VAL-2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol


class TrainerView(Protocol):
    """What a callback may use of the trainer (a `SupervisedTrainer` is one): the update
    just validated, the run directory, and `save` of the committed state."""

    @property
    def step(self) -> int: ...

    @property
    def run_directory(self) -> Path: ...

    def save(self, path: Path | str) -> Path: ...


class ValidationCallback(Protocol):
    """Called on rank 0 with the trainer and the validation metrics of the current step.

    `trainer.save(path)` is allowed here: it writes the state all ranks committed before
    validation began, with no collective (so it cannot deadlock). Optional `state_dict` /
    `load_state_dict` methods make the callback's state part of checkpoints.
    """

    def on_validation(self, trainer: TrainerView, metrics: dict[str, float]) -> None: ...


class SaveBest:
    """Keeps `best.pt` in the run directory: the snapshot with the lowest metric so far.

    `trainer.save_best: true` in a recipe adds one (on `validation/mse`) to every trainer.
    Its best value is part of checkpoints, so a resumed run only replaces best.pt with a
    better snapshot.
    """

    def __init__(self, metric: str = "validation/mse", filename: str = "best.pt") -> None:
        self.metric = metric
        self.filename = filename
        self.best = math.inf
        self.best_step: int | None = None

    def on_validation(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        value = metrics.get(self.metric)
        if value is None or not value < self.best:
            return
        self.best, self.best_step = float(value), trainer.step
        trainer.save(trainer.run_directory / self.filename)

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "best": self.best, "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = float(state["best"]), state["best_step"]
