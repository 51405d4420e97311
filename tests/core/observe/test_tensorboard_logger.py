"""`trainer.loggers: [jsonl, tensorboard]` (R-OBS-2): event files repeat metrics.jsonl exactly,
also when a run continues after a crash and a roll-back; a missing package is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodichain.core.runs.run_dir import read_metrics
from tests.support import TESTS, assert_ok, run_cli, worker_env, write_recipe

FACTORIES = TESTS / "factories"
BOTH = ["jsonl", "tensorboard"]


def events(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the run's event files, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def records(run: Path) -> dict[str, list[tuple[int, float]]]:
    """The same view of metrics.jsonl, values rounded to float32 as TensorBoard stores them."""
    import numpy

    series: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(run / "metrics.jsonl").records:
        for key, value in record.items():
            if key != "step":
                series.setdefault(key, []).append((record["step"],
                                                   float(numpy.float32(value))))
    return series


def test_event_files_hold_the_records_of_metrics_jsonl(resumed_at_100: Path) -> None:
    first_part = resumed_at_100 / "at_100"  # trained to 100 (conftest)
    first = records(first_part)
    assert {"train/loss", "train/lr", "validation/mse", "time/elapsed_s"} <= set(first)
    assert events(first_part) == first
    # continued in place to 200: a second event file, still one value per step
    run = resumed_at_100 / "run"
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2
    after = records(run)
    assert [s for s, _ in after["validation/mse"]] == [50, 100, 150, 200]
    assert events(run) == after


@pytest.mark.slow
def test_a_rolled_back_tail_leaves_the_event_stream(tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="interrupting:build_supervised_trainer",
                          **{"trainer.loggers": BOTH})
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_FAIL_AT="171")
    crashed = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env)
    assert crashed.returncode == 1, crashed.stderr
    assert [s for s, _ in events(run)["train/loss"]][-1] == 170  # written beyond step_100.pt
    # `resume` rolls metrics.jsonl back to the snapshot (records beyond it go to a side
    # file); the event files keep theirs, so TensorBoard must drop them by itself.
    resumed = run_cli("resume", str(run), "--no-progress",
                      env=worker_env(PYTHONPATH=str(FACTORIES)))
    assert_ok(resumed)
    events_log = json.loads((run / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events_log] == [
        ("failed", 171), ("rolled_back", 100), ("resumed", 100)]
    after = records(run)
    assert [s for s, _ in after["train/loss"]] == list(range(10, 201, 10))
    assert events(run) == after


def test_missing_tensorboard_is_refused_before_training(tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "tensorboard").mkdir(parents=True)
    (fake / "tensorboard" / "__init__.py").write_text(
        "raise ImportError('No module named tensorboard (simulated)')\n")
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.loggers": BOTH})
    proc = run_cli("train-sl", "--config", str(recipe), env=worker_env(PYTHONPATH=str(fake)))
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'embodichain-sl[tensorboard]'" in proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert not run.exists()


@pytest.mark.parametrize("loggers", [["jsonl"], None])
def test_jsonl_alone_writes_no_event_files(tmp_path: Path, loggers: list[str] | None) -> None:
    changes = {"trainer.max_updates": 20} | ({"trainer.loggers": loggers} if loggers else {})
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **changes)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    assert not (tmp_path / "run" / "tensorboard").exists()
