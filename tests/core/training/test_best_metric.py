"""The user's own metric, either direction, and early stop (R-MET-1, R-MET-2, R-UX-1).

A third-party classification factory (tests/factories/classifying.py, named as
`module:attribute` with tests/factories on PYTHONPATH) trained by 2 gloo workers with
`best: {metric: validation/accuracy, mode: max}`, `save_best` and `early_stop`; one run is
shared by the tests of this module. Expectations are computed from its metrics.jsonl.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.manifest import checkpoint_step
from embodichain.core.runs.run_dir import read_metrics
from tests.support import (
    FACTORIES,
    assert_ok,
    run_cli,
    run_torchrun,
    snapshot_dir,
    worker_env,
    write_recipe,
)
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_training_state_equal, comparable_records

PATIENCE = 3
MAX_UPDATES = 400


def classification_recipe(path: Path, output_dir: Path, patience: int = PATIENCE) -> Path:
    recipe = {
        "factory": "classifying:build_supervised_trainer", "seed": 0,
        "trainer": {"batch_size": 16, "max_updates": MAX_UPDATES, "validate_every": 10,
                    "save_every": 100, "log_every": 10, "output_dir": str(output_dir),
                    "save_best": True, "best": {"metric": "validation/accuracy", "mode": "max"},
                    "early_stop": {"patience": patience}},
        "optimizer": {"name": "adam", "lr": 0.01},
        "data": {"spread": 0.7},
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def env() -> dict[str, str]:
    return worker_env(PYTHONPATH=str(FACTORIES))


@pytest.fixture(scope="module")
def classified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The classification run, 2 workers, plain progress lines (not a terminal)."""
    root = tmp_path_factory.mktemp("classified")
    recipe = classification_recipe(root / "c.yaml", root / "run")
    proc = run_torchrun("train-sl", "--config", str(recipe), env=env())
    assert_ok(proc)
    (root / "stdout.txt").write_text(proc.stdout)
    (root / "stderr.txt").write_text(proc.stderr)
    return root / "run"


def accuracy(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["validation/accuracy"])
            for r in read_metrics(run / "metrics.jsonl").records if "validation/accuracy" in r]


def highest(series: list[tuple[int, float]]) -> tuple[int, float]:
    """The first update of the highest accuracy (ties keep the earliest)."""
    best = max(value for _, value in series)
    return next((step, value) for step, value in series if value == best)


def patience_stop(series: list[tuple[int, float]], patience: int) -> int | None:
    """Where early stop must end: the validation that makes `patience` in a row without a
    strict improvement (min_delta 0)."""
    best, since = None, 0
    for step, value in series:
        if best is None or value > best:
            best, since = value, 0
        else:
            since += 1
            if since == patience:
                return step
    return None


@pytest.mark.slow
def test_best_pt_holds_the_update_of_the_highest_accuracy(classified: Path) -> None:
    """Catches best.pt kept by the lowest value (the worst accuracy), or not kept at all
    because only validation/mse is known."""
    step, value = highest(accuracy(classified))
    assert checkpoint_step(classified / "best.pt") == step
    best = read_checkpoint(classified / "best.pt")["payload"]["run"]
    assert best["metrics"]["validation/accuracy"] == value
    assert best["step"] == step and step != accuracy(classified)[0][0]  # not just the first


@pytest.mark.slow
def test_early_stop_ends_where_the_patience_says(classified: Path) -> None:
    """Catches an early stop that never fires, fires late or early, ends without a
    snapshot, or is not recorded in run.json."""
    series = accuracy(classified)
    end = patience_stop(series, PATIENCE)
    assert end is not None and end < MAX_UPDATES
    assert series[-1][0] == end and read_metrics(classified / "metrics.jsonl").last_step == end
    assert checkpoint_step(classified / "last.pt") == end
    events = json.loads((classified / "run.json").read_text())["events"]
    assert events[-1]["event"] == "stopped_early"
    assert (events[-1]["step"], events[-1]["best_step"]) == (end, highest(series)[0])
    tracker = read_checkpoint(classified / "last.pt")["payload"]["run"]["best_tracker"]
    assert tracker["since"] == PATIENCE and tracker["step"] == highest(series)[0]


@pytest.mark.slow
def test_summary_runs_and_progress_lines_name_accuracy(classified: Path) -> None:
    """Catches a hard-coded `val_mse` bar field, a summary whose best is the lowest
    accuracy, and a runs table that only knows validation/mse."""
    end = accuracy(classified)[-1][0]
    best_step, best = highest(accuracy(classified))
    stdout = (classified.parent / "stdout.txt").read_text()
    stderr = (classified.parent / "stderr.txt").read_text()
    assert f"stopped early at update {end} (best at {best_step})" in stdout.splitlines()[0]
    assert re.search(rf"^  validation/accuracy +final \S+ \(update {end}\), best {best:.6g} "
                     rf"\(update {best_step}\)$", stdout, re.M), stdout
    lines = [line for line in stderr.splitlines() if line.startswith("update ")]
    assert lines and all("val_accuracy" in line for line in lines), stderr
    assert "val_mse" not in stderr
    assert f"update {end}/{MAX_UPDATES}" in lines[-1]

    rows = json.loads(cli_in_process("runs", str(classified), "--json").stdout)
    assert len(rows) == 1
    row = rows[0]
    assert (row["metric"], row["metric_mode"]) == ("validation/accuracy", "max")
    assert (row["metric_best"], row["metric_best_step"]) == (best, best_step)
    assert row["state"] == "stopped_early"
    assert row["state_text"] == f"stopped early at update {end} (best at {best_step})"


@pytest.mark.slow
def test_resume_leaves_an_early_stopped_run_unchanged(classified: Path, tmp_path: Path) -> None:
    """Catches a resume that trains on after an early stop (as if it were interrupted) or
    touches the directory."""
    run = tmp_path / "run"
    shutil.copytree(classified, run)
    before = snapshot_dir(run)
    proc = run_torchrun("resume", str(run), env=env())
    assert_ok(proc)
    assert "is complete: it stopped early at update" in proc.stdout + proc.stderr
    assert snapshot_dir(run) == before


@pytest.mark.slow
def test_a_raised_patience_continues_exactly(classified: Path, tmp_path: Path) -> None:
    """`resume --set trainer.early_stop.patience=N` equals a run that had patience N from
    the start, bitwise: model, optimizer, every rank's state, best.pt and the standing on
    the metric. Catches early-stop or SaveBest state that is not checkpointed (the resumed
    run would stop at another update or pick another best.pt)."""
    series = accuracy(classified)
    longer = PATIENCE + 3
    reference = tmp_path / "reference"
    recipe = classification_recipe(tmp_path / "r.yaml", reference, patience=longer)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env()))
    resumed = tmp_path / "resumed"
    shutil.copytree(classified, resumed)
    proc = run_torchrun("resume", str(resumed), "--set",
                        f"trainer.early_stop.patience={longer}", "--no-progress", env=env())
    assert_ok(proc)
    end = read_metrics(reference / "metrics.jsonl").last_step
    assert end is not None and end > series[-1][0]  # it did continue past the first stop
    assert read_metrics(resumed / "metrics.jsonl").last_step == end
    assert comparable_records(resumed) == comparable_records(reference)
    assert assert_training_state_equal(resumed / "last.pt", reference / "last.pt") > 0
    assert assert_training_state_equal(resumed / "best.pt", reference / "best.pt") > 0
    trackers = [read_checkpoint(r / "last.pt")["payload"]["run"]["best_tracker"]
                for r in (resumed, reference)]
    assert trackers[0] == trackers[1]
    if end < MAX_UPDATES:
        assert json.loads((resumed / "run.json").read_text())["events"][-1]["step"] == end


def test_a_metric_validation_does_not_produce_stops_at_the_first_validation(
        tmp_path: Path) -> None:
    """Catches a best metric that is silently never found (no best.pt, `-` in the bar)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{
        "trainer.best": {"metric": "validation/accuracy", "mode": "max"},
        "trainer.max_updates": 120})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 1, proc.stderr
    assert "trainer.best.metric is validation/accuracy" in proc.stderr
    assert "reported only: validation/mse" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert read_metrics(run / "metrics.jsonl").last_step == 50  # the first validation


@pytest.mark.parametrize("key", ["save_best", "early_stop"])
def test_best_pt_or_early_stop_without_evaluate_is_refused(tmp_path: Path, key: str) -> None:
    """Catches save_best / early_stop accepted for a trainer that never validates (no
    best.pt, no stop, said nowhere)."""
    run = tmp_path / "run"
    recipe = classification_recipe(tmp_path / "c.yaml", run)
    data = yaml.safe_load(recipe.read_text())
    data["data"]["val_size"] = 0
    data["trainer"]["save_best" if key == "early_stop" else "early_stop"] = (
        False if key == "early_stop" else None)
    recipe.write_text(yaml.safe_dump(data))
    proc = run_cli("train-sl", "--config", str(recipe), env=env())
    assert proc.returncode == 2, proc.stderr
    assert f"trainer.{key} need validation" in proc.stderr
    assert not run.exists()
