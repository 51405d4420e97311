"""R-RUN-1: a fresh run needs an artifact-free output directory, claimed exclusively."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import pytest

from embodichain.core.errors import RefusedError
from embodichain.core.runs.run_dir import claim
from tests.support import (
    TESTS,
    TIMEOUT,
    run_cli,
    run_torchrun,
    snapshot_dir,
    start_python_module,
    worker_env,
    workers_output,
    write_recipe,
)

SCRIPTS = TESTS / "scripts"
REFUSAL = "already holds a run"
SHORT = {"trainer.max_updates": 5, "trainer.save_every": 5, "trainer.validate_every": 5,
         "trainer.log_every": 5}


def test_second_fresh_run_in_one_process_exits_2_and_changes_nothing(
        sl_ddp_one_process, copy_run, tmp_path):
    run = copy_run(sl_ddp_one_process)
    before = snapshot_dir(run)
    recipe = write_recipe(tmp_path / "again.yaml", run)
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert REFUSAL in proc.stderr and str(run) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot_dir(run) == before


def worker_exit_codes(output: str) -> list[str]:
    """The per-worker exit codes of torchrun's failure report (not its log lines)."""
    return re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", output, flags=re.MULTILINE)


def root_cause_exit_code(output: str) -> str:
    cause = output.split("Root Cause (first observed failure):", 1)[1]
    return worker_exit_codes(cause)[0]


@pytest.mark.slow
def test_second_fresh_run_under_torchrun_is_refused(sl_ddp_two_workers, copy_run, tmp_path):
    run = copy_run(sl_ddp_two_workers)
    before = snapshot_dir(run)
    recipe = write_recipe(tmp_path / "again.yaml", run)
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output  # torchrun's own code when a worker fails
    assert root_cause_exit_code(output) == "2", output
    # design §9: each worker exits 2 (a worker still shutting down when torchrun reacts to the
    # first exit ignores torchrun's SIGTERM and still ends with its own code, never -15).
    assert worker_exit_codes(output) == ["2", "2"], output
    assert workers_output(output).count(REFUSAL) == 1, output  # said once, by rank 0
    assert str(run) in output
    assert snapshot_dir(run) == before


@pytest.mark.slow
def test_every_torchrun_worker_exits_2_on_a_refusal(tmp_path):
    """Each worker's own exit code, recorded beyond the reach of torchrun's SIGTERM."""
    run = tmp_path / "used"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = snapshot_dir(run)
    recipe = write_recipe(tmp_path / "again.yaml", run)
    probe = tmp_path / "exit_codes"
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    # Fresh workers: the probe's own exit must be quick (it never imports torch), or
    # torchrun's SIGTERM could meet it in interpreter shutdown, where its handler is gone.
    proc = run_torchrun(str(probe), "--", "-m", "embodichain", "train-sl", "--config",
                        str(recipe), "--no-progress", module="exit_code_probe",
                        env=worker_env(PYTHONPATH=path), fresh=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert [(probe / f"exit_rank{r}").read_text() for r in (0, 1)] == ["2", "2"], output
    assert worker_exit_codes(output) == ["2", "2"], output
    assert workers_output(output).count(REFUSAL) == 1, output
    assert "embodichain/core" not in output and "embodichain/cli" not in output  # no worker
    # traceback: one paragraph (torchrun's own traceback of ChildFailedError is its business)
    assert snapshot_dir(run) == before


@pytest.mark.parametrize("artifact", ["run.json", "metrics.jsonl", "model.pt", "step_7.pt"])
def test_any_artifact_makes_a_directory_used(tmp_path, artifact):
    (tmp_path / artifact).write_bytes(b"not mine")
    (tmp_path / "notes.txt").write_text("keep")
    before = snapshot_dir(tmp_path)
    with pytest.raises(RefusedError, match=REFUSAL):
        claim(tmp_path, {"run_id": "x"})
    assert snapshot_dir(tmp_path) == before


def test_an_artifact_free_directory_is_claimed(tmp_path):
    (tmp_path / "notes.txt").write_text("keep")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "old.pt").write_bytes(b"only top-level artifacts count")
    claim(tmp_path, {"run_id": "mine"})
    assert json.loads((tmp_path / "run.json").read_text()) == {"run_id": "mine"}
    assert (tmp_path / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run.json", "sub"]


def test_a_missing_directory_is_created(tmp_path):
    target = tmp_path / "a" / "b"
    claim(target, {"run_id": "mine"})
    assert json.loads((target / "run.json").read_text())["run_id"] == "mine"


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(RefusedError, match="not a directory"):
        claim(target, {"run_id": "x"})
    assert target.read_text() == "x"


def test_racing_claims_have_exactly_one_winner(tmp_path):
    """16 threads released together claim one directory, 20 times over."""
    for round_ in range(20):
        directory = tmp_path / f"race{round_}"
        start = threading.Barrier(16)
        outcome: dict[int, str] = {}

        def contend(i: int, directory: Path = directory, start: threading.Barrier = start,
                    outcome: dict[int, str] = outcome) -> None:
            start.wait()
            try:
                claim(directory, {"run_id": f"contender-{i}", "pad": "x" * 4096})
                outcome[i] = "won"
            except RefusedError:
                outcome[i] = "refused"

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [i for i, result in outcome.items() if result == "won"]
        assert len(outcome) == 16 and len(winners) == 1, outcome
        # run.json is the winner's, complete; no temporary file is left behind.
        assert json.loads((directory / "run.json").read_text())["run_id"] == \
            f"contender-{winners[0]}"
        assert [p.name for p in directory.iterdir()] == ["run.json"]


@pytest.mark.slow
def test_two_launches_racing_for_one_directory(tmp_path):
    """Two `train-sl` processes started together into one empty directory: one trains."""
    out = tmp_path / "contested"
    recipes = [write_recipe(tmp_path / f"r{i}.yaml", out, **SHORT) for i in range(2)]
    procs = [start_python_module("embodichain", "train-sl", "--config", str(r), "--no-progress",
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in recipes]
    results = [(p.wait(timeout=TIMEOUT), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    loser_stderr = next(err for code, _, err in results if code == 2)
    assert str(out) in loser_stderr and "Traceback" not in loser_stderr
    identity = json.loads((out / "run.json").read_text())
    assert identity["config_sha256"]
    assert {"run.json", "metrics.jsonl", "step_5.pt", "last.pt"} <= \
        {p.name for p in out.iterdir()}
