"""The end-of-run summary (R-UX-2): once, on rank 0, with the figures of metrics.jsonl."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from embodichain.core.observe.summary import summary_lines
from embodichain.core.runs.run_dir import read_metrics


def _expected(run: Path) -> dict[str, str]:
    """`key -> "final X (update N)[, best Y (update M)]"`, computed from metrics.jsonl."""
    records = read_metrics(run / "metrics.jsonl").records
    expected = {}
    for key in ("train/loss", "validation/mse"):
        series = [(r["step"], r[key]) for r in records if key in r]
        step, final = series[-1]
        text = f"final {final:.6g} (update {step})"
        if key.startswith("validation/"):
            best_step, best = min(series, key=lambda sv: (sv[1], sv[0]))
            text += f", best {best:.6g} (update {best_step})"
        expected[key] = text
    return expected


@pytest.mark.slow
def test_summary_once_on_rank_zero_with_the_recorded_figures(sl_ddp_two_workers: Path) -> None:
    run = sl_ddp_two_workers
    stdout = (run.parent / "stdout.txt").read_text()
    stderr = (run.parent / "stderr.txt").read_text()
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    heads = [line for line in (stdout + stderr).splitlines() if "finished at update" in line]
    assert heads == [f"run {run_id[:12]} finished at update 200/200"], stdout + stderr
    lines = {line.split()[0]: " ".join(line.split()[1:]) for line in stdout.splitlines()
             if line.startswith("  ")}
    for key, text in _expected(run).items():
        assert lines[key] == text, stdout
    assert lines["updates"].startswith("200 in this process (0 -> 200), 200 in total; ")
    assert "updates/s" in lines["updates"]
    assert lines["snapshots"] == "step_100.pt, step_200.pt, last.pt (update 200)"
    assert lines["run"] == f"dir {run}"
    assert lines["train"] == (f"on OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 "
                              f"-m embodichain resume {run} --set trainer.max_updates=400")
    assert lines["inspect"] == f"embodichain inspect-checkpoint {run}/last.pt"


def test_best_is_the_lowest_with_its_update_and_stopped_runs_say_how_to_continue(
        tmp_path: Path) -> None:
    """Without a recorded `best`, validation/mse (min) is the best metric; another
    validation key gets no "best" (a variant assuming lower-is-better for every key fails)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({
        "run_id": "abc123def4567890", "world_size": 1,
        "config": {"trainer": {"max_updates": 400}}}))
    records = [{"step": 50, "train/loss": 3.0, "validation/mse": 2.0, "validation/x": 9.0},
               {"step": 100, "train/loss": 1.5, "validation/mse": 0.5, "validation/x": 8.0},
               {"step": 150, "train/loss": 1.25, "validation/mse": 0.75}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "step_100.pt").write_bytes(b"")
    (run / "step_20.pt").write_bytes(b"")
    lines = summary_lines(run, status="stopped", start_step=100, end_step=150, wall_s=2.0,
                          reason="SIGTERM")
    assert lines[0] == "run abc123def456 stopped at update 150/400: SIGTERM"
    text = "\n".join(lines)
    assert "validation/mse final 0.75 (update 150), best 0.5 (update 100)" in text
    assert "validation/x   final 8 (update 100)\n" in text
    assert "train/loss     final 1.25 (update 150)\n" in text
    assert "50 in this process (100 -> 150), 150 in total; 2.0 s wall, 25.0 updates/s" in text
    assert "snapshots      step_20.pt, step_100.pt\n" in text  # by step, not by name
    assert f"continue       embodichain resume {run}\n" in text


def test_a_failed_run_says_what_exists_and_how_to_continue(tmp_path: Path) -> None:
    from tests.support import TESTS, run_cli, worker_env, write_recipe

    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="interrupting:build_supervised_trainer")
    factories = TESTS / "factories"
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   env=worker_env(PYTHONPATH=str(factories), EMBODICHAIN_TEST_FAIL_AT="151"))
    assert proc.returncode == 1, proc.stderr
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"run {run_id[:12]} failed at update 150/200", proc.stdout
    assert "  snapshots      step_100.pt, last.pt (update 100)" in lines
    assert f"  continue       embodichain resume {run}" in lines
    assert "simulated crash at update 151" in proc.stderr  # the error itself, after it


def test_a_signalled_run_says_where_it_stopped(endless_run_stopped: dict) -> None:
    """Catches a summary that names another update than the stop's snapshot, a missing
    snapshot line or continue command, and a signalled run not exiting 143."""
    live = endless_run_stopped  # an endless run SIGTERMed after step_500.pt (conftest)
    run, out, err = live["run"], live["stdout"], live["stderr"]
    assert live["returncode"] == 143, err
    step = read_metrics(run / "metrics.jsonl").last_step
    head = out.splitlines()[0]
    assert head.startswith("run ") and " stopped at update " in head, out
    stopped_at = int(head.split(" stopped at update ")[1].split("/")[0])
    assert stopped_at >= step >= 500 and f"last.pt (update {stopped_at})" in out, out
    assert re.search(rf"^  continue +embodichain resume {re.escape(str(run))}$", out, re.M), out
