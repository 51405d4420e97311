"""Which metric is best and which way (R-MET-1), early stop's count (R-MET-2), and what may
change on resume; in process, no training."""

from __future__ import annotations

import sys

import pytest
import torch

from embodichain.core.recipe.best import Best, BestTracker, MetricMissing
from embodichain.core.recipe.loading import read_recipe_file, validate_recipe
from embodichain.core.runs.resume_policy import config_differences
from embodichain.core.training.callbacks import SaveBest
from tests.support import CPU_RECIPE, FACTORIES
from tests.support.state_compare import assert_state_equal


def test_direction_ties_and_min_delta() -> None:
    """Catches a lower-is-better comparison for a `max` metric, ties counted as
    improvements, and a min_delta that is ignored or counted from the wrong side."""
    up, down = Best("validation/accuracy", "max"), Best()
    assert up.improves(0.9, 0.8) and not up.improves(0.8, 0.9) and not up.improves(0.8, 0.8)
    assert down.improves(0.8, 0.9) and not down.improves(0.9, 0.8)
    assert up.improves(0.75, 0.5, min_delta=0.25) and not up.improves(0.625, 0.5, 0.25)
    assert up.best_of([(10, 0.5), (20, 0.7), (30, 0.7), (40, 0.6)]) == (0.7, 20)
    assert down.best_of([(10, 0.5), (20, 0.7)]) == (0.5, 10)
    assert up.label == "val_accuracy" and Best("train/x").label == "train_x"


def test_tracker_counts_validations_without_improvement() -> None:
    """Catches a count that is not reset by an improvement, or reset by one below
    min_delta (the best value still moves: best.pt's view is strict)."""
    tracker = BestTracker(Best("validation/accuracy", "max"))
    for step, value in [(10, 0.5), (20, 0.5625), (30, 0.75), (40, 0.625)]:
        tracker.observe(step, {"validation/accuracy": value}, min_delta=0.125)
    assert (tracker.value, tracker.step, tracker.reference, tracker.since) == (0.75, 30, 0.75, 1)
    assert tracker.exhausted(1) and not tracker.exhausted(2) and not tracker.exhausted(None)
    with pytest.raises(MetricMissing, match="reported only: validation/loss"):
        tracker.observe(50, {"validation/loss": 1.0, "time/validation_s": 0.1})
    again = BestTracker(Best("validation/accuracy", "max"))
    again.load_state_dict(tracker.state_dict())
    assert again == tracker
    other = BestTracker(Best("validation/loss", "min"))
    other.load_state_dict(tracker.state_dict())  # another metric: its own standing, afresh
    assert other.since == 0 and other.value is None


def test_save_best_state_is_per_metric_and_reads_old_checkpoints() -> None:
    """Catches SaveBest restoring another metric's best (it would never save again) and a
    state from before `mode` existed (best = inf) read as a real value."""
    saver = SaveBest("validation/accuracy", mode="max")
    saver.load_state_dict({"metric": "validation/mse", "best": 0.1, "best_step": 50})
    assert saver.best is None
    old = SaveBest()
    old.load_state_dict({"metric": "validation/mse", "best": float("inf"), "best_step": None})
    assert old.best is None
    old.load_state_dict({"metric": "validation/mse", "best": 0.25, "best_step": 100})
    assert (old.best, old.best_step) == (0.25, 100)


def _trainer(changes: dict, factory: str = "sl_ddp"):
    raw = read_recipe_file(CPU_RECIPE)
    raw["factory"] = factory
    raw["trainer"].update(changes)
    if factory != "sl_ddp":
        raw.pop("model"), raw.pop("data")
    recipe = validate_recipe(raw)
    return recipe.factory(recipe.config, torch.device("cpu"))


def test_the_recipe_overrides_the_factory_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a factory's `best=` that is ignored, or one that beats the recipe's."""
    monkeypatch.syspath_prepend(str(FACTORIES))
    factory = "classifying:build_supervised_trainer"
    assert _trainer({}).best == Best("validation/mse", "min")
    assert _trainer({}, factory).best == Best("validation/accuracy", "max")
    trainer = _trainer({"best": {"metric": "validation/loss"}, "save_best": True}, factory)
    assert trainer.best == Best("validation/loss", "min")
    saver = trainer.callbacks[-1]
    assert (saver.metric, saver.mode) == ("validation/loss", "min")
    sys.modules.pop("classifying", None)


def test_what_may_change_on_resume() -> None:
    """trainer.best may change and the patience may rise; a lower patience, a new
    min_delta or an early stop added or removed is refused."""
    base = {"trainer": {"max_updates": 200, "best": None,
                        "early_stop": {"patience": 3, "min_delta": 0.0}}}

    def changed(**trainer) -> list[str]:
        return config_differences(base, {"trainer": {**base["trainer"], **trainer}}, 100)

    assert changed(best={"metric": "validation/accuracy", "mode": "max"}) == []
    assert changed(early_stop={"patience": 5, "min_delta": 0.0}) == []
    assert_state_equal(changed(early_stop={"patience": 2, "min_delta": 0.0}),
                       ["trainer.early_stop.patience: 2 is below the checkpoint's 3 (a "
                        "patience may only be raised)"])
    assert changed(early_stop={"patience": 3, "min_delta": 0.1})
    assert changed(early_stop=None)


def test_run_json_says_the_metric_and_whether_it_stopped_early() -> None:
    """A resume's `best` wins over the start's; a resume after an early stop supersedes it.
    Catches readers that keep the first metric after `--set trainer.best...` on resume, or
    call a run that trained on after a raised patience "stopped early"."""
    from embodichain.core.runs.best_record import run_best, stopped_early_event

    start = {"best": {"metric": "validation/accuracy", "mode": "max"}, "events": []}
    assert run_best(start) == Best("validation/accuracy", "max")
    assert run_best({}) == Best()
    stop = {"event": "stopped_early", "step": 80, "best_step": 50}
    start["events"] = [stop]
    assert stopped_early_event(start) == stop
    start["events"].append({"event": "resumed", "step": 80,
                            "best": {"metric": "validation/loss", "mode": "min"}})
    assert stopped_early_event(start) is None
    assert run_best(start) == Best("validation/loss", "min")
