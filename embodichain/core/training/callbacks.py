"""Validation callbacks. They run on rank 0 after each validation (R-VAL-1, R-VAL-2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from embodichain.core.recipe.best import DEFAULT_BEST, Best
from embodichain.core.recipe.schema import Mode


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
    """Keeps `best.pt` in the run directory: the snapshot with the best metric so far.

    `trainer.save_best: true` in a recipe adds one, on the run's best metric (`trainer.best`,
    R-MET-1), to every trainer. `mode` says which direction is better; ties keep the earlier
    snapshot. Its best value is part of checkpoints, so a resumed run only replaces best.pt
    with a better snapshot.
    """

    def __init__(self, metric: str = DEFAULT_BEST.metric, filename: str = "best.pt",
                 mode: Mode = DEFAULT_BEST.mode) -> None:
        self.metric = metric
        self.filename = filename
        self.mode = mode
        self._best = Best(metric, mode)
        self.best: float | None = None
        self.best_step: int | None = None

    def on_validation(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        value = metrics.get(self.metric)
        if value is None or not self._best.improves(float(value), self.best):
            return
        self.best, self.best_step = float(value), trainer.step
        trainer.save(trainer.run_directory / self.filename)

    def state_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "mode": self.mode, "best": self.best,
                "best_step": self.best_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Another metric or direction (`trainer.best` changed on resume) starts afresh;
        # checkpoints from before `mode` existed were lower-is-better.
        if (state.get("metric"), state.get("mode", "min")) != (self.metric, self.mode):
            return
        best = state.get("best")
        self.best = None if best is None or math.isinf(best) else float(best)
        self.best_step = state["best_step"]
