"""`embodichain resume RUN_DIR`: continue an interrupted run in place (R-RESUME-6)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from embodichain.core.runs.run_dir import remove_stale_temp_files
from tests.support import (
    REPO,
    assert_ok,
    run_torchrun,
    worker_env,
    write_recipe,
)
from tests.support.state_compare import assert_same_outcome

FACTORIES = REPO / "tests" / "factories"


@pytest.mark.slow
def test_resume_run_dir_after_a_crash_equals_the_uninterrupted_run(
        sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """Catches stale temp files of ours left (or foreign ones removed), and an in-place
    resume that differs from the uninterrupted run in any checkpoint, record or event."""
    run = tmp_path / "interrupted"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="interrupting:build_supervised_trainer",
                          **{"trainer.save_every": 50})
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_FAIL_AT="151")
    crashed = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env)
    assert crashed.returncode != 0 and "simulated crash at update 151" in crashed.stderr
    assert torch.load(run / "last.pt", weights_only=True)["manifest"]["step"] == 150
    recipe.unlink()  # the stored recipe is enough
    # What saves killed mid-write leave behind (never *.pt), beside files that are not ours.
    stale = [".step_200.pt.4242.deadbeef.tmp", ".last.pt.4242.deadbeef.tmp",
             ".best.pt.77.0123abcd.tmp", ".run.json.4242.tmp", ".run.json.4242.0badc0de.tmp"]
    others = ["notes.tmp", ".step_100.pt.bak", "step_150.pt.4242.deadbeef.tmp", ".run.json",
              ".last.pt.tmp", "my.run.json.4242.tmp"]
    for name in stale + others:
        (run / name).write_bytes(b"partial")
    (run / ".step_50.pt.1.ab.tmp").mkdir()  # a directory, whatever its name, is not ours

    env = worker_env(PYTHONPATH=str(FACTORIES))
    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=env))
    assert not [name for name in stale if (run / name).exists()]
    assert all((run / name).read_bytes() == b"partial" for name in others)
    assert (run / ".step_50.pt.1.ab.tmp").is_dir()

    assert torch.load(run / "last.pt", weights_only=True)["manifest"]["step"] == 200
    # the whole outcome: every part of the state, the whole history, one resume (the crash
    # at 151 left no record past the snapshot at 150)
    compared = assert_same_outcome(run, sl_ddp_two_workers, events=[("resumed", 150)],
                                   checkpoints=["step_100.pt", "step_200.pt", "last.pt"],
                                   foreign=(*others, ".step_50.pt.1.ab.tmp"))
    assert compared >= 3 * 18


@pytest.mark.slow
def test_resume_run_dir_rolls_back_history_beyond_the_snapshot(sl_ddp_two_workers: Path,
                                                               tmp_path: Path) -> None:
    """R-RESUME-6: records after the newest snapshot are moved aside, not mixed or lost.
    Catches a roll-back not done, not recorded, or not byte for byte, and any inexact state."""
    run = tmp_path / "run"
    shutil.copytree(sl_ddp_two_workers, run)
    (run / "step_200.pt").unlink()
    shutil.copyfile(run / "step_100.pt", run / "last.pt")  # metrics go on to 200
    original = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    beyond = [line for line in original if json.loads(line)["step"] > 100]

    proc = run_torchrun("resume", str(run), "--no-progress")
    assert_ok(proc)
    assert proc.stderr.count("rolled back") == 1  # one line, from rank 0 alone
    events = json.loads((run / "run.json").read_text())["events"]
    rolled = [e for e in events if e["event"] == "rolled_back"]
    assert len(rolled) == 1 and rolled[0]["step"] == 100
    assert rolled[0]["records"] == len(beyond) and rolled[0]["last_step"] == 200
    assert (run / rolled[0]["moved_to"]).read_text() == "".join(beyond)  # byte for byte
    assert rolled[0]["moved_to"] in proc.stderr
    assert assert_same_outcome(run, sl_ddp_two_workers, events=[
        ("rolled_back", 100, len(beyond)), ("resumed", 100)]) >= 3 * 18


def test_remove_stale_temp_files_takes_only_our_temp_names(tmp_path: Path) -> None:
    ours = [".step_20.pt.31.0a1b2c3d.tmp", ".last.pt.31.0a1b2c3d.tmp", ".run.json.31.tmp",
            ".run.json.31.ffffffff.tmp", ".during_validation_100.pt.9.12345678.tmp"]
    theirs = ["step_20.pt", "last.pt", "run.json", "metrics.jsonl", ".step_20.pt.tmp",
              "step_20.pt.31.0a1b2c3d.tmp", ".step_20.pt.x.0a1b2c3d.tmp", "a.tmp",
              ".step_20.pt.31.0a1b2c3d.tmp.keep", ".hidden"]
    for name in ours + theirs:
        (tmp_path / name).write_text("x")
    assert remove_stale_temp_files(tmp_path) == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs)
    assert remove_stale_temp_files(tmp_path) == []
