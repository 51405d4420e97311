"""`embodichain resume RUN_DIR`: continue an interrupted run in place (R-RESUME-6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from conftest import (
    REPO,
    assert_ok,
    run_torchrun,
    snapshot_dir,
    tensors_by_path,
    worker_env,
    write_recipe,
)

FACTORIES = REPO / "tests" / "factories"


def _records_after(metrics: Path, step: int) -> list[dict]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")}
            for r in records if r["step"] > step]


def test_resume_run_dir_after_a_crash_equals_the_uninterrupted_run(
        sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    run = tmp_path / "interrupted"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="interrupting:build_supervised_trainer",
                          **{"trainer.save_every": 50})
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_FAIL_AT="151")
    crashed = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env)
    assert crashed.returncode != 0 and "simulated crash at update 151" in crashed.stderr
    assert torch.load(run / "last.pt", weights_only=True)["manifest"]["step"] == 150
    recipe.unlink()  # the stored recipe is enough

    env = worker_env(PYTHONPATH=str(FACTORIES))
    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=env))

    ours = torch.load(run / "last.pt", weights_only=True)["payload"]
    reference = torch.load(sl_ddp_two_workers / "last.pt", weights_only=True)["payload"]
    assert ours["run"]["step"] == reference["run"]["step"] == 200
    for part in ("learner", "ranks"):
        mine, theirs = dict(tensors_by_path(ours[part])), dict(tensors_by_path(reference[part]))
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert torch.equal(mine[key], theirs[key]), f"{part}{key} differs"
    assert _records_after(run / "metrics.jsonl", 150) == \
        _records_after(sl_ddp_two_workers / "metrics.jsonl", 150)
    events = json.loads((run / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events] == [("resumed", 150)]


def test_resume_run_dir_is_refused_when_history_is_ahead(sl_ddp_two_workers: Path,
                                                         tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(sl_ddp_two_workers, run)
    shutil.copyfile(run / "step_100.pt", run / "last.pt")  # metrics go on to 200
    before = snapshot_dir(run)
    proc = run_torchrun("resume", str(run), "--no-progress")
    assert proc.returncode == 1  # torchrun's own code; each worker exited 2
    assert "exitcode  : 2" in proc.stderr
    message = "already has records up to update 200"
    assert proc.stderr.count(message) == 1  # from rank 0 alone
    assert "embodichain train-sl --config" in proc.stderr  # the fresh-destination command
    assert snapshot_dir(run) == before
