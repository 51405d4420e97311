"""Which metric is "best", in which direction, and when a run stops early (R-MET-1, R-MET-2).

One choice, `trainer.best: {metric, mode}` (or the factory's `SupervisedTrainer(best=...)`,
else `validation/mse`, `min`), decides best.pt, the summary's best, the progress bar's
validation field, the `runs` column and `report`'s table. Everything that compares values
of a metric does it through `improves` here, so no other place assumes a direction.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from embodichain.core.errors import TrainingError, UsageError
from embodichain.core.recipe.schema import BestConfig, Mode, TrainerConfig


@dataclass(frozen=True)
class Best:
    """The chosen metric and its direction."""

    metric: str = "validation/mse"
    mode: Mode = "min"

    def as_dict(self) -> dict[str, str]:
        return {"metric": self.metric, "mode": self.mode}

    @property
    def label(self) -> str:
        """The progress bar's name for it: `validation/accuracy` -> `val_accuracy`."""
        name = self.metric
        if name.startswith("validation/"):
            name = "val_" + name[len("validation/"):]
        return name.replace("/", "_")

    def improves(self, value: float, than: float | None, min_delta: float = 0.0) -> bool:
        """Whether `value` is better than `than` (None: nothing yet) by at least
        `min_delta`; with `min_delta` 0, any strict improvement. Ties never improve."""
        if than is None:
            return True
        gain = than - value if self.mode == "min" else value - than
        return gain > 0 and gain >= min_delta

    def best_of(self, series: Iterable[tuple[int, float]]) -> tuple[float, int] | None:
        """(value, step) of the best in `(step, value)` pairs; ties keep the earliest."""
        found: tuple[float, int] | None = None
        for step, value in series:
            if self.improves(value, found[0] if found else None):
                found = (value, step)
        return found


DEFAULT_BEST = Best()


def best_from(value: Any) -> Best:
    """A `Best` from a `BestConfig`, a `(metric, mode)` pair, a mapping or a `Best`."""
    if isinstance(value, Best):
        return value
    if isinstance(value, BestConfig):
        return Best(value.metric, value.mode)
    try:
        config = (BestConfig(**value) if isinstance(value, Mapping)
                  else BestConfig(metric=value[0], mode=value[1]))
    except (TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"best must be (metric, 'min' | 'max'), e.g. ('validation/accuracy', "
                         f"'max'); got {value!r}") from exc
    return Best(config.metric, config.mode)


def choose_best(trainer: TrainerConfig, factory_best: Any, has_evaluate: bool) -> Best:
    """The run's best metric: the recipe's `trainer.best`, else the factory's, else
    validation/mse (min). Refuses (exit 2, before training) what cannot work: best.pt or
    early stop without a validation to read them from."""
    wanted = [key for key, on in (("trainer.save_best", trainer.save_best),
                                  ("trainer.early_stop", trainer.early_stop is not None)) if on]
    if wanted and not has_evaluate:
        raise UsageError(f"{' and '.join(wanted)} need validation, but the factory's trainer "
                         "has no `evaluate`; remove them from the recipe or give "
                         "SupervisedTrainer an evaluate. Nothing was started.")
    if trainer.early_stop is not None and not trainer.validate_every:
        raise UsageError("trainer.early_stop needs validations: set trainer.validate_every "
                         "(it is 0). Nothing was started.")
    if trainer.best is not None:
        return best_from(trainer.best)
    return best_from(factory_best) if factory_best is not None else DEFAULT_BEST


class MetricMissing(TrainingError):
    """Validation did not report the chosen metric (exit 1, at the first validation)."""


@dataclass
class BestTracker:
    """The run's standing on its best metric, identical on every rank and checkpointed.

    `value`/`step`: the best so far (strict improvement, ties keep the earliest, as best.pt
    and the summary). `reference`/`since`: early stop's view, where only an improvement by
    at least `min_delta` resets the count of validations without one.
    """

    best: Best = DEFAULT_BEST
    value: float | None = None
    step: int | None = None
    reference: float | None = None
    since: int = 0

    def observe(self, step: int, metrics: Mapping[str, float], min_delta: float = 0.0) -> None:
        """Take one validation's metrics; raises MetricMissing when the metric is absent."""
        if self.best.metric not in metrics:
            produced = ", ".join(sorted(k for k in metrics if not k.startswith("time/")))
            raise MetricMissing(
                f"trainer.best.metric is {self.best.metric}, but validation at update {step} "
                f"reported only: {produced or 'nothing'}. Name one of these in trainer.best "
                "(e.g. --set trainer.best.metric=KEY), or report it from the factory's evaluate")
        value = float(metrics[self.best.metric])
        if self.best.improves(value, self.value):
            self.value, self.step = value, step
        if self.best.improves(value, self.reference, min_delta):
            self.reference, self.since = value, 0
        else:
            self.since += 1

    def exhausted(self, patience: int | None) -> bool:
        """Whether early stop with `patience` ends the run now."""
        return patience is not None and self.since >= patience

    def state_dict(self) -> dict[str, Any]:
        return {**self.best.as_dict(), "value": self.value, "step": self.step,
                "reference": self.reference, "since": self.since}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore; the state of another metric or direction (`trainer.best` changed on
        resume) is not this one's, so the standing starts afresh."""
        if not state or (state.get("metric"), state.get("mode")) != (self.best.metric,
                                                                    self.best.mode):
            return
        self.value, self.step = state.get("value"), state.get("step")
        self.reference, self.since = state.get("reference"), int(state.get("since") or 0)


def patience_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """A lowered `trainer.early_stop.patience` on resume (flattened recipes): only raising
    it continues the run as the uninterrupted one would have gone on."""
    a, b = old.get("trainer.early_stop.patience"), new.get("trainer.early_stop.patience")
    if isinstance(a, int) and isinstance(b, int) and b < a:
        return [f"trainer.early_stop.patience: {b} is below the checkpoint's {a} (a patience "
                "may only be raised)"]
    return []


def stopped_early(run: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
    """Why the snapshot whose run section is `run` is complete by early stop under the
    resolved recipe `config`, or None when it is not (R-MET-2)."""
    trainer = config.get("trainer") or {}
    patience = (trainer.get("early_stop") or {}).get("patience")
    state = run.get("best_tracker") or {}
    step = run.get("step")
    if not isinstance(patience, int) or int(state.get("since") or 0) < patience:
        return None
    if isinstance(step, int) and step >= int(trainer.get("max_updates") or 0):
        return None  # it reached max_updates: finished, not stopped early
    since = int(state.get("since") or 0)
    return (f"stopped early at update {step} (best at {state.get('step')}): {since} "
            f"validations in a row without an improvement of {state.get('metric')}. To train "
            f"on, raise the patience: --set trainer.early_stop.patience=N (N > {since})")
