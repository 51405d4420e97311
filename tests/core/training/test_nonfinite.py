"""`trainer.on_nonfinite` (design §9): a non-finite global loss stops the run at that update
(exit 1, naming it and the last good snapshot) or is skipped like a zero-weight batch;
metrics.jsonl stays strict JSON either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodichain.core.checkpoint.manifest import checkpoint_step
from tests.support import run_cli, run_torchrun, write_recipe
from tests.support.cli import cli_in_process

# SGD at this rate diverges within a few updates: the loss reaches inf, then nan.
DIVERGING = {"optimizer.name": "sgd", "optimizer.lr": 1.0e6, "trainer.max_updates": 30,
             "trainer.log_every": 1, "trainer.save_every": 2, "trainer.validate_every": 0}


def strict_records(path: Path) -> list[dict]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant} in {path}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def first_nonfinite(records: list[dict]) -> int:
    return next(r["step"] for r in records if "train/nonfinite" in r)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["one-process", "torchrun-2"])
def test_stop_names_the_update_and_the_last_good_snapshot(launch: str, tmp_path: Path
                                                          ) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **DIVERGING)
    if launch == "one-process":
        proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    else:
        proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", nproc=2)
    assert proc.returncode == 1, proc.stderr  # a training failure, on every rank: no hang
    records = strict_records(tmp_path / "run" / "metrics.jsonl")
    step = first_nonfinite(records)
    assert max(r["step"] for r in records) == step  # stopped there
    snapshots = sorted((tmp_path / "run").glob("step_*.pt"))
    assert [p.name for p in snapshots] == [f"step_{n}.pt" for n in range(2, step, 2)]
    # The snapshot named is the one `resume` continues from: last.pt, of the newest save
    # (a variant naming the newest step file instead names an older one after a time-based
    # or stop snapshot).
    last_good = tmp_path / "run" / "last.pt"
    assert checkpoint_step(last_good) == (step - 1) // 2 * 2
    assert "non-finite training loss (" in proc.stderr and "trainer.on_nonfinite" in proc.stderr
    assert f"at update {step}" in proc.stderr and f"the last good snapshot is {last_good}" \
        in proc.stderr
    # Every worker says the same update; the only traceback is torchrun's own report.
    tracebacks = proc.stderr.split("Traceback (most recent call last):")[1:]
    if launch == "one-process":
        assert not tracebacks, proc.stderr
    else:
        assert len(tracebacks) == 1 and "ChildFailedError" in tracebacks[0], proc.stderr
        rank_1 = [line for line in proc.stderr.splitlines()
                  if line.startswith("[rank 1] error: non-finite training loss")]
        assert rank_1 and f"at update {step}:" in rank_1[0]  # both ranks stopped there


def test_skip_continues_without_applying_the_update(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**DIVERGING, "trainer.on_nonfinite": "skip"})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    records = strict_records(tmp_path / "run" / "metrics.jsonl")
    step = first_nonfinite(records)
    skipped = {r["step"] for r in records if r.get("train/skipped") == 1}
    nonfinite = {r["step"] for r in records if r.get("train/nonfinite") == 1}
    assert step in skipped and nonfinite <= skipped and max(r["step"] for r in records) == 30
    # Skipped updates were not applied: the model stays finite and inspectable.
    inspected = cli_in_process("inspect-checkpoint", str(tmp_path / "run" / "last.pt"), "--json")
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["step"] == 30


def test_helpers() -> None:
    from embodichain.core.runs.run_dir import finite_values
    from embodichain.core.training.nonfinite import nonfinite_loss

    assert nonfinite_loss([4.0, float("nan")]) and nonfinite_loss([4.0, float("inf"), 1.0])
    assert not nonfinite_loss([0.0, 0.0]) and not nonfinite_loss([2.0, 3.0])
    assert finite_values({"a": 1.0, "b": float("nan"), "c": -float("inf"), "d": 2}) == \
        {"a": 1.0, "d": 2}
