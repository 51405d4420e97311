"""R-RESUME-1/3, R-VAL-2: resuming reproduces the uninterrupted run bit for bit.

Run A is the shared 200-update session run (tests/conftest.py); each test resumes from its
step_100.pt into a fresh directory and compares every tensor of the result with run A's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support import assert_ok, run_cli, run_torchrun, snapshot_dir, write_recipe
from tests.support.recovery import (
    assert_state_equal,
    assert_training_state_equal,
    factory_env,
    metrics,
    run_json,
    without_time,
)
from tests.support.state_compare import assert_same_outcome

GUARD = 240  # seconds: a deadlocked collective fails the test instead of hanging CI


def _check_resumed(run_a: Path, resumed: Path, world_size: int) -> None:
    assert sorted(p.name for p in resumed.glob("*.pt")) == ["last.pt", "step_200.pt"]
    # the whole outcome: both checkpoints, the records after update 100, no event (a fresh
    # destination records where it came from in `resumed_from`, checked below)
    compared = assert_same_outcome(resumed, run_a, events=[], records_after=100)
    # model (4) + Adam state (2 x 4 + steps) + per rank torch RNG, keys, sampler generator
    assert compared >= 2 * (12 + 3 * world_size)
    ranks = read_checkpoint(resumed / "last.pt")["payload"]["ranks"]
    assert sorted(ranks) == list(range(world_size))
    after_100 = [r for r in metrics(run_a) if r["step"] > 100]
    assert after_100 and any("validation/mse" in r for r in after_100)
    a, b = run_json(run_a), run_json(resumed)
    assert b["run_id"] != a["run_id"]
    assert b["resumed_from"] == {"run_id": a["run_id"], "checkpoint": str(run_a / "step_100.pt"),
                                 "step": 100}


@pytest.mark.slow
def test_two_workers_resume_from_step_100_is_bitwise_exact(sl_ddp_two_workers: Path,
                                                           tmp_path: Path) -> None:
    """Catches any state restored inexactly (rank 0's streams on every rank, a lost
    sampler position, optimizer counter, ...), records after 100 that differ, an event
    written into the fresh destination, and a source run that is touched."""
    run_a = sl_ddp_two_workers
    before = snapshot_dir(run_a)
    ranks = read_checkpoint(run_a / "step_100.pt")["payload"]["ranks"]
    assert sorted(ranks) == [0, 1]
    # the ranks really do carry different streams, so restoring rank 0's everywhere would show
    assert ranks[0]["rng"]["python"] != ranks[1]["rng"]["python"]
    assert ranks[0]["sampler"]["generator"].ne(ranks[1]["sampler"]["generator"]).any()

    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "resumed")
    proc = run_torchrun("train-sl", "--config", str(recipe), "--resume",
                        str(run_a / "step_100.pt"), "--no-progress", timeout=GUARD)
    assert_ok(proc)
    _check_resumed(run_a, tmp_path / "resumed", world_size=2)
    assert snapshot_dir(run_a) == before  # R-RESUME-3: the source run is untouched


def test_one_process_resume_from_step_100_is_bitwise_exact(sl_ddp_one_process: Path,
                                                           tmp_path: Path) -> None:
    """As the two-worker test, in one process."""
    run_a = sl_ddp_one_process
    before = snapshot_dir(run_a)
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "resumed")
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(run_a / "step_100.pt"),
                   "--no-progress", timeout=GUARD)
    assert_ok(proc)
    _check_resumed(run_a, tmp_path / "resumed", world_size=1)
    assert snapshot_dir(run_a) == before


@pytest.mark.slow
def test_save_from_validation_callback_completes_and_resumes_exactly(
        sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """R-VAL-2: rank 0 saves inside validation with no collective; the file is exact."""
    run_a = sl_ddp_two_workers
    factory = "recovery_factories:save_in_validation"
    first = write_recipe(tmp_path / "v.yaml", tmp_path / "v", factory=factory,
                         **{"trainer.max_updates": 100, "trainer.save_best": True})
    # a deadlock (a collective inside the callback) would hit the timeout guard
    assert_ok(run_torchrun("train-sl", "--config", str(first), "--no-progress",
                           env=factory_env(), timeout=GUARD))
    v = tmp_path / "v"
    assert sorted(p.name for p in v.glob("*.pt")) == [
        "best.pt", "during_validation_100.pt", "during_validation_50.pt", "last.pt",
        "step_100.pt"]
    # the state committed by both ranks before validation = the state saved after it (run A
    # has no callbacks, and SaveBest runs after the saving callback: callback state differs)
    assert_training_state_equal(run_a / "step_100.pt", v / "during_validation_100.pt",
                                callbacks=False)
    assert_training_state_equal(v / "step_100.pt", v / "during_validation_100.pt",
                                callbacks=False)

    validations = {r["step"]: r["validation/mse"] for r in metrics(v) if "validation/mse" in r}
    assert sorted(validations) == [50, 100]
    best_step = min(validations, key=validations.get)
    best = read_checkpoint(v / "best.pt")
    assert best["manifest"]["step"] == best_step
    assert_training_state_equal(v / f"during_validation_{best_step}.pt", v / "best.pt",
                                callbacks=False)
    saved_best = best["payload"]["callbacks"]["1:SaveBest"]
    assert saved_best == {"metric": "validation/mse", "mode": "min",
                          "best": validations[best_step], "best_step": best_step}

    second = write_recipe(tmp_path / "w.yaml", tmp_path / "w", factory=factory,
                          **{"trainer.save_best": True})
    assert_ok(run_torchrun("train-sl", "--config", str(second), "--resume",
                           str(v / "during_validation_100.pt"), "--no-progress",
                           env=factory_env(), timeout=GUARD))
    w = tmp_path / "w"
    assert_training_state_equal(run_a / "step_200.pt", w / "step_200.pt", callbacks=False)
    assert_training_state_equal(run_a / "last.pt", w / "last.pt", callbacks=False)
    assert without_time(metrics(w)) == without_time(
        [r for r in metrics(run_a) if r["step"] > 100])
    # SaveBest continued from its restored best, and best.pt follows validation/mse
    validations.update({r["step"]: r["validation/mse"] for r in metrics(w)
                        if "validation/mse" in r})
    overall = min(validations, key=validations.get)
    assert read_checkpoint(w / "best.pt")["manifest"]["step"] == overall


def test_save_best_recipe_key_keeps_best_pt(tmp_path: Path) -> None:
    """`trainer.save_best: true` with the built-in recipe adds SaveBest by itself."""
    recipe = write_recipe(tmp_path / "b.yaml", tmp_path / "b",
                          **{"trainer.max_updates": 40, "trainer.validate_every": 20,
                             "trainer.save_every": 0, "trainer.save_best": True})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", timeout=GUARD))
    run = tmp_path / "b"
    assert sorted(p.name for p in run.glob("*.pt")) == ["best.pt", "last.pt"]
    validations = {r["step"]: r["validation/mse"] for r in metrics(run) if "validation/mse" in r}
    best = read_checkpoint(run / "best.pt")
    best_step = min(validations, key=validations.get)
    assert best["manifest"]["step"] == best_step
    assert best["payload"]["callbacks"] == {
        "0:SaveBest": {"metric": "validation/mse", "mode": "min",
                       "best": validations[best_step], "best_step": best_step}}
    assert best_step == 40  # validation MSE still falls fast this early
    assert_state_equal(best["payload"]["learner"],
                       read_checkpoint(run / "last.pt")["payload"]["learner"])
