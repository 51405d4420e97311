"""R-EVAL-4: a stop agreed while a closed-loop validation is due or running costs no update.

The closed_loop recipe of test_closed_loop.py (4 updates, validations at 2 and 4), its
simulator slowed to 0.5 s a step by EMBODICHAIN_TEST_EVAL_STEP_S (the recipe, and with it the
resume, stays the same: the resume runs at full speed), is stopped during the validation at
update 2 and resumed; the uninterrupted runs of test_closed_loop.py (shared) are the
reference. The broken variants each test catches are named in its docstring; the one they
share: a stop that waits for the validation to end and saves after it (the episode loop
never looking at the stop request) stops at update 3, not 2, with a validation metric at 2
(and in a real run, whose validation outlasts torchrun's 30 s grace, is SIGKILLed with no
snapshot at all).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from tests.core.evaluation import test_closed_loop as closed_loop
from tests.core.evaluation.test_closed_loop import records, validation_lines, write
from tests.support import assert_ok, factories_env, run_cli, run_torchrun, torchrun_workers
from tests.support.processes import start_python_module, torchrun_killpg_race
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # torchrun runs stopped and resumed

world_runs = closed_loop.world_runs  # the uninterrupted runs (shared, read-only)
STOP_AT = 2  # the first validation
GRACE_S = 30.0  # torchrun's (and SLURM's default) time from SIGTERM to SIGKILL
TORCHRUN = ["torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
            "-m", "embodichain"]


def _stopped_in_validation(tmp_path: Path, acts: Path, to_rank: int | None,
                           launch: list[str] = TORCHRUN, **evaluation: object
                           ) -> tuple[Path, int, str, float]:
    """Train under torchrun (or `launch`) with a slow simulator; once the validation at
    update 2 has stepped its first episode, SIGTERM the launcher's process group (`to_rank`
    None, as `kill -TERM -- -PGID` or a batch system does) or only that rank's worker.
    Returns the run directory, the launcher's exit code, what it printed and the seconds
    from the signal to its exit."""
    run, mark = tmp_path / "run", tmp_path / "first_steps.txt"
    acts.mkdir()
    recipe = write(tmp_path / "r.yaml", run, data={"acts_log": str(acts)}, evaluation=evaluation)
    out = (tmp_path / "out.txt").open("w")
    proc = start_python_module(
        launch[0], *launch[1:], "train-sl", "--config", str(recipe), "--no-progress",
        stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=factories_env(EMBODICHAIN_TEST_EVAL_STEP_S="0.5",
                          EMBODICHAIN_TEST_EVAL_MARK=str(mark)))
    try:
        deadline = time.monotonic() + 240
        while not mark.exists():
            assert proc.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.monotonic() < deadline, "no validation started"
            time.sleep(0.05)
        if to_rank is None:
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(torchrun_workers(proc.pid)[to_rank], signal.SIGTERM)
        signalled = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
    print(f"SIGTERM to {'the group' if to_rank is None else f'rank {to_rank}'} during the "
          f"validation: exit {code} after {took:.1f} s")
    return run, code, (tmp_path / "out.txt").read_text(), took


def _kept_the_update_and_no_metric(run: Path, printed: str, took: float) -> None:
    """last.pt holds update 2 with its validation due, the cut-short evaluation is recorded
    as interrupted, and nothing of it is a metric or an evaluation's records."""
    assert f"stopped by SIGTERM at update {STOP_AT} of 4: saved {run / 'last.pt'} " \
           f"(update {STOP_AT})" in printed, printed
    assert took < GRACE_S, f"the stop took {took:.1f} s: torchrun would SIGKILL it"
    saved = read_checkpoint(run / "last.pt")
    assert saved["manifest"]["step"] == STOP_AT
    assert saved["payload"]["run"]["validation_due"] is True
    assert f"the validation at update {STOP_AT} was cut short by SIGTERM" in printed, printed
    evaluations = run / "evaluations"
    assert [p.name for p in evaluations.iterdir()] == [f"update_{STOP_AT:06d}.interrupted.jsonl"]
    assert all(r["episode"] in range(6) for r in records(
        evaluations / f"update_{STOP_AT:06d}.interrupted.jsonl"))
    assert validation_lines(run) == {}


def _resumes_as_if_never_stopped(run: Path, reference: Path, launcher=run_torchrun) -> None:
    """`resume` validates update 2 first, then trains on: the state bitwise, the metrics
    and every evaluation's records equal to the uninterrupted run's."""
    assert_ok(launcher("resume", str(run), "--no-progress", env=factories_env()))
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 2
    assert comparable_records(run) == comparable_records(reference)
    for step in (2, 4):
        name = f"update_{step:06d}.jsonl"
        assert records(run / "evaluations" / name) == records(reference / "evaluations" / name)


def test_sigterm_to_the_group_during_a_validation_saves_its_update_at_once(
        world_runs: dict[str, str], tmp_path: Path) -> None:
    """2 ranks under torchrun, SIGTERM to its process group while the validation at update
    2 steps a slow simulator. Catches: an episode loop that never looks at the stop request
    (the validation finishes: a metric at 2, last.pt at 3), ranks that do not agree (one
    leaves the evaluation's collectives: a hang or a lost peer, no snapshot), the cut-short
    evaluation taken for a result (a metric, records at 2), a snapshot without the
    validation still due, and a resume that skips it (records differ). torchrun itself
    exits 1 (its own SignalException, docs/recovery.md)."""
    run, code, printed, took = _stopped_in_validation(tmp_path, tmp_path / "acts", None)
    assert code == 1, printed
    _kept_the_update_and_no_metric(run, printed, took)
    _resumes_as_if_never_stopped(run, Path(world_runs["ddp2"]))


def test_sigterm_to_one_rank_during_a_validation_stops_every_rank_there(
        world_runs: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM to rank 1's worker alone during the validation at update 2: every rank
    agrees between two steps and stops at update 2. Catches a stop request looked at only
    on the rank that got it (rank 0 goes on alone and the ranks' evaluation collectives no
    longer match), and rank 1's own signal left out of the agreement."""
    run, code, printed, took = _stopped_in_validation(tmp_path, tmp_path / "acts", 1)
    assert code == 1, printed  # torchrun reports its workers' exit 143 as a failure
    # ... or torchrun's own race once every rank stopped; the checks below are what this
    # test is about.
    assert ("exitcode  : 143" in printed or "exit code: 143" in printed
            or torchrun_killpg_race(printed)), printed
    _kept_the_update_and_no_metric(run, printed, took)
    _resumes_as_if_never_stopped(run, Path(world_runs["ddp2"]))


def test_sigterm_to_one_process_and_its_simulator_processes_during_a_validation(
        world_runs: dict[str, str], tmp_path: Path) -> None:
    """One process with `vector: async` (a simulator process per slot, in its process
    group), the whole group SIGTERMed during the validation at update 2: the same clean
    stop, exit 143, and the resume equals the uninterrupted `sync` run. Catches a stop that
    waits for the slots' episodes, and simulator processes that do not leave SIGTERM to
    their trainer (started by forkserver or spawn, they die of it: their episodes recorded
    as failed, "the environment process ended (exit code -15)"; forked, they run a copy of
    the trainer's handler)."""
    run, code, printed, took = _stopped_in_validation(
        tmp_path, tmp_path / "acts", None, ["embodichain"], vector="async")
    assert code == 143, printed
    _kept_the_update_and_no_metric(run, printed, took)
    finished = records(run / "evaluations" / f"update_{STOP_AT:06d}.interrupted.jsonl")
    assert all(r["failure"] is None for r in finished), finished
    handlers = {line.split(" ", 2)[2] for line in
                (tmp_path / "first_steps.txt").read_text().splitlines()}
    assert handlers == {repr(signal.SIG_IGN)}, handlers
    _resumes_as_if_never_stopped(run, Path(world_runs["ddp1"]), run_cli)


@pytest.mark.parametrize("stop_at", [2, 4])
def test_a_stop_agreed_when_a_validation_is_due_saves_first_then_resume_validates(
        stop_at: int, world_runs: dict[str, str], tmp_path: Path) -> None:
    """One process that gets SIGTERM in the update before `stop_at`: the stop is agreed at
    `stop_at`, whose validation is due (4: the last update). Catches a trainer that
    validates before it saves (a metric at `stop_at` in the stopped run), a stop at the
    last update taken for the run's end (exit 0, `runs` says finished, the validation
    lost), and a resume that does not run the skipped validation first (the metrics and
    records at `stop_at` missing: they differ from the uninterrupted run's)."""
    acts = tmp_path / "acts"
    acts.mkdir()
    run = tmp_path / "run"
    recipe = write(tmp_path / "r.yaml", run, data={"acts_log": str(acts)})
    stopped = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env(EMBODICHAIN_TEST_SIGTERM_AT=str(stop_at - 1)))
    assert stopped.returncode == 143, stopped.stdout + stopped.stderr
    saved = read_checkpoint(run / "last.pt")
    assert saved["manifest"]["step"] == stop_at
    assert saved["payload"]["run"]["validation_due"] is True
    assert stop_at not in validation_lines(run)
    assert not (run / "evaluations" / f"update_{stop_at:06d}.jsonl").exists()
    listed = run_cli("runs", str(tmp_path), "--json")
    assert_ok(listed)
    (row,) = json.loads(listed.stdout)
    assert row["state_text"] == f"stopped cleanly at update {stop_at} (SIGTERM)", row
    assert_ok(run_cli("resume", str(run), "--no-progress", env=factories_env()))
    reference = Path(world_runs["ddp1"])
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 2
    assert comparable_records(run) == comparable_records(reference)
    for step in (2, 4):
        name = f"update_{step:06d}.jsonl"
        assert records(run / "evaluations" / name) == records(reference / "evaluations" / name)
