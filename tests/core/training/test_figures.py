"""An update's figures read during the next update (R-GPU-1) are still acted on as that
update's: a run that logs every 5th update lags the others' figures, and every skipped
update (zero global weight) is recorded at its own step, the last one included."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodichain.core.runs.run_dir import read_metrics
from tests.support.in_process import train_in_process

UPDATES, LOG_EVERY = 13, 5  # 13 is no multiple of 5: the last update is read only as the last


@pytest.fixture(scope="module")
def lagged_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[int]]:
    """One process, one example per update, half the corpus unsupervised
    (tests/scripts/zero_weight_factory.py): some updates weigh 0 and are skipped. The run's
    directory and the updates the learner skipped (from each update's own result)."""
    run = tmp_path_factory.mktemp("lagged") / "run"
    results = train_in_process(run, [
        "factory=zero_weight_factory:build_supervised_trainer", "trainer.batch_size=1",
        f"trainer.max_updates={UPDATES}", f"trainer.log_every={LOG_EVERY}",
        "trainer.validate_every=0", "trainer.save_every=0"])
    assert len(results) == UPDATES
    return run, {step for step, result in enumerate(results, 1) if result.skipped}


def _recorded_skips(run: Path) -> set[int]:
    return {r["step"] for r in read_metrics(run / "metrics.jsonl").records
            if r.get("train/skipped") == 1}


def test_lagged_figures_are_recorded_at_their_own_update(
        lagged_run: tuple[Path, set[int]]) -> None:
    """Catches lagged figures acted on as the next update's (`act_on_lagged(self.step)`
    instead of the update they belong to): `train/skipped` lands one update late. Every
    other test logs every update, so nothing there lags."""
    run, skipped = lagged_run
    lagged = {s for s in skipped if s % LOG_EVERY and s != UPDATES}
    assert lagged  # not vacuous: skipped updates whose figures were read late
    assert _recorded_skips(run) - {UPDATES} == skipped - {UPDATES}


def test_the_last_updates_figures_are_read_at_once(lagged_run: tuple[Path, set[int]]) -> None:
    """Catches the last update's figures left lagged (the `max_updates` condition of
    `read_at_once` dropped): nothing comes after it to read them, so its skip (or its
    non-finite loss, or a failed save) would never be acted on."""
    run, skipped = lagged_run
    assert UPDATES in skipped  # not vacuous: this seed's last update weighs 0
    assert UPDATES in _recorded_skips(run)
