"""Recovery without a human (R-RESUME-6..9, R-RUN-5, R-SIG-1), with real torchrun workers.

Every scenario is compared with one uninterrupted run of the same recipe (`reference`):
whatever was killed, stopped or rolled back, the finished run's state is bitwise the same.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics
from tests.support import (
    REPO,
    RESTART_RECIPE,
    SCRIPTS,
    TIMEOUT,
    assert_ok,
    child_pids,
    run_cli,
    run_torchrun,
    snapshot_dir,
    worker_env,
    write_recipe,
)
from tests.support.processes import (
    run_python_module,
    start_python_module,
    torchrun_killpg_race,
    torchrun_workers,
)
from tests.support.state_compare import assert_same_outcome, event_summary, implied_events

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

FACTORIES = REPO / "tests" / "factories"
RECIPE = RESTART_RECIPE
MAX_UPDATES = RECIPE["trainer.max_updates"]
TORCHRUN = "torch.distributed.run"


def _env(**extra: str) -> dict[str, str]:
    return worker_env(PYTHONPATH=os.pathsep.join((str(FACTORIES), str(SCRIPTS))), **extra)


def _torchrun_args(*args: str, max_restarts: int = 0, module: tuple[str, ...] = ("embodichain",)
                   ) -> list[str]:
    """The arguments of `python -m torch.distributed.run` for 2 workers running `module`."""
    return ["--standalone", "--nnodes=1", "--nproc-per-node=2", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2", "-m", *module, *args]


def _block_env(tmp_path: Path, update: int) -> tuple[dict[str, str], Path]:
    """Rank 0 stops inside `update` until the test creates the returned file (restarting.py)."""
    release = tmp_path / "release"
    return {"EMBODICHAIN_TEST_BLOCK_AT": str(update),
            "EMBODICHAIN_TEST_BLOCK_FILE": str(release)}, release


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before the test could act"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.05)


def _last_step(directory: Path) -> int:
    log = read_metrics(directory / "metrics.jsonl")
    return log.last_step or 0


def _events(directory: Path) -> list[dict]:
    return json.loads((directory / "run.json").read_text())["events"]


def _assert_equals_reference(run: Path, reference: Path, events: list[tuple] | None) -> None:
    """The whole outcome (`assert_same_outcome`): every checkpoint, metrics.jsonl, events."""
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == MAX_UPDATES
    assert assert_same_outcome(run, reference, events=events) >= 18 * 8


def _copy_without_steps_after(reference: Path, run: Path, step: int) -> Path:
    """A copy of the reference run whose step files beyond `step` are gone."""
    shutil.copytree(reference, run)
    for n in range(step + 40, MAX_UPDATES, 40):
        (run / f"step_{n}.pt").unlink()
    return run


def _wait_for_step(directory: Path, step: int, proc: subprocess.Popen, timeout: float = 120
                   ) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (directory / "metrics.jsonl").exists() and _last_step(directory) >= step:
            return _last_step(directory)
        assert proc.poll() is None, "the run ended before the test could interrupt it"
        time.sleep(0.05)
    raise AssertionError(f"no record of update {step} within {timeout}s")


def _worker(agent: int, rank: int) -> int:
    """The pid of torchrun worker `rank` started by the agent process `agent`."""
    workers = torchrun_workers(agent)
    assert rank in workers, f"no worker of rank {rank} under pid {agent}"
    return workers[rank]




@pytest.fixture()
def reference(restart_reference: Path) -> Path:
    """The restart recipe trained without interruption by 2 workers (conftest, shared with
    tests/core/launch/test_multinode.py; read-only)."""
    return restart_reference


WHOLE_KILL_AT = 190  # rank 0 blocks inside this update until torchrun A is SIGKILLed whole


def test_sigkills_under_max_restarts_and_a_rerun_continue_exactly(reference: Path,
                                                                  tmp_path: Path) -> None:
    """3 SIGKILLs of single workers (one inside a save) and one of the whole torchrun, at
    update WHOLE_KILL_AT while rank 0 is held there (so every EMBODICHAIN_TEST_SEED passes).
    One of each kind a run meets: a worker killed between saves (random rank and update)
    and rank 0 killed inside a save, both absorbed by torchrun A's restarts, the whole
    torchrun killed, and a worker killed between saves again after the rerun (absorbed by
    the rerun's own restart, the kill log carried across the rerun); each roll-back names
    its own side file (3 or more of them), and torchrun A restarts twice in a row.
    Catches a restart or rerun that rolls nothing back (records repeated: metrics differ
    from the reference's), rolls back without recording it (no `rolled_back` event, or one
    whose count or side file is wrong), or restores any state inexactly (a checkpoint
    differs)."""
    seed = int(os.environ.get("EMBODICHAIN_TEST_SEED", "20261130"))
    rng = random.Random(seed)
    # Random updates in bands around the fixed points: the save kill at 120 and the
    # whole-torchrun kill at WHOLE_KILL_AT, after the second kill and before the third.
    # Each band lies 11 to 39 updates past a save (every 40; records every 10), so each
    # worker kill, whatever the seed, leaves records past its snapshot to roll back.
    bands = [(15, 40), (211, 240)]
    kills = [{"id": f"k{i}", "rank": rng.randrange(2), "update": rng.randrange(*band)}
             for i, band in enumerate(bands)]
    kills.insert(1, {"id": "save", "rank": 0, "save": 120})  # between last.pt and step_120.pt
    # torchrun A absorbs the first 2 kills (within --max-restarts=3) and is then killed
    # whole; the rerun of the same command absorbs the remaining one.
    kill_log = tmp_path / "kills.log"
    env = _env(EMBODICHAIN_TEST_KILLS=json.dumps(kills), EMBODICHAIN_TEST_KILL_LOG=str(kill_log),
               EMBODICHAIN_TEST_SLEEP_S="0.004")
    block, release = _block_env(tmp_path, WHOLE_KILL_AT)
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    command = _torchrun_args("train-sl", "--config", str(recipe), "--resume", "auto",
                             "--no-progress", max_restarts=3)

    first = start_python_module(TORCHRUN, *command, env={**env, **block},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_file(release.with_name(release.name + ".reached"), first)
        assert kill_log.read_text().split() == ["k0", "save"]
        snapshot = WHOLE_KILL_AT // 40 * 40  # the newest save before the block: wait for it
        deadline = time.monotonic() + TIMEOUT
        while not ((run / "last.pt").exists()
                   and read_checkpoint(run / "last.pt")["manifest"]["step"] == snapshot):
            assert time.monotonic() < deadline, f"last.pt never reached update {snapshot}"
            time.sleep(0.05)
        workers = list(torchrun_workers(first.pid).values())
        first.send_signal(signal.SIGKILL)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
    finally:
        output_a = first.communicate(timeout=60)[0]
    assert first.returncode == -signal.SIGKILL
    # what the rerun must record first: the records of updates snapshot+1 .. 189 rolled back
    whole_kill = implied_events(run, snapshot)
    assert whole_kill[-2] == ("rolled_back", snapshot, 2), whole_kill  # updates 170, 180

    rerun = run_python_module(TORCHRUN, *command, env=env)
    assert rerun.returncode == 0, output_a + rerun.stdout + rerun.stderr
    assert kill_log.read_text().split() == [k["id"] for k in
                                            sorted(kills, key=lambda k: k.get("update") or 120)]
    # Each worker kill lands while a save may still be in flight, so which snapshot each
    # restart finds is not fixed: those events are checked for consistency (every roll-back
    # names its side file, holding exactly its records, the reference's), the rest exactly.
    _assert_equals_reference(run, reference, events=None)
    events = event_summary(run)
    assert events[:len(whole_kill)] == whole_kill
    resumed = [e for e in _events(run) if e["event"] == "resumed"]
    assert len(resumed) == 4  # 2 restarts of A, its rerun, and 1 restart of the rerun
    # the kill inside the save: last.pt was at 120 while step_120.pt was not yet renamed
    assert any(e["step"] == 120 and e["checkpoint"] == "last.pt" for e in resumed)
    lost = [k["update"] - 1 - (k["update"] - 1) // 40 * 40 for k in kills if "update" in k]
    print(f"seed {seed}; kills {kills}; whole torchrun killed at update {WHOLE_KILL_AT}; "
          f"updates of work lost per worker SIGKILL: {lost}")


def _start(recipe: Path, module: tuple[str, ...] = ("embodichain",), **env: str
           ) -> subprocess.Popen:
    return start_python_module(TORCHRUN, *_torchrun_args("train-sl", "--config", str(recipe),
                                                         "--no-progress", module=module),
                               env=_env(**env), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("how", ["SIGINT to torchrun", "SIGTERM to one worker"])
def test_a_signal_stops_every_rank_with_a_snapshot_and_resume_continues_exactly(
        how: str, reference: Path, tmp_path: Path) -> None:
    """Catches a rank that does not stop, or exits with another code than 130 / 143 (each
    worker's own code is recorded by tests/scripts/exit_code_recorder.py: for SIGINT to
    torchrun its report shows none, and a worker slower to exit than the other would show
    torchrun's SIGTERM), a snapshot not of the stop update, and an inexact resume
    (`assert_same_outcome`: nothing to roll back, the clean stop recorded in run.json, then
    one `resumed` event)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    codes = tmp_path / "codes"
    proc = _start(recipe, module=("exit_code_recorder", str(codes), "--"),
                  EMBODICHAIN_TEST_SLEEP_S="0.01")
    try:
        _wait_for_step(run, 60, proc)
        if how == "SIGINT to torchrun":
            proc.send_signal(signal.SIGINT)
        else:
            (worker,) = child_pids(_worker(proc.pid, 1))  # under exit_code_recorder
            os.kill(worker, signal.SIGTERM)
    finally:
        out, err = proc.communicate(timeout=120)
    name, code = ("SIGINT", 130) if how == "SIGINT to torchrun" else ("SIGTERM", 143)
    assert proc.returncode == 1, f"torchrun exited {proc.returncode}\n{err}"  # interrupted / failed
    assert {p.name: p.read_text() for p in codes.iterdir()} == {
        "exit_rank0": str(code), "exit_rank1": str(code)}, err  # each worker's own code
    stopped = read_checkpoint(run / "last.pt")["manifest"]["step"]
    assert 60 <= stopped < MAX_UPDATES
    assert _last_step(run) <= stopped  # no record beyond the snapshot: nothing to roll back
    printed = [line for line in err.splitlines() if line.startswith("stopped by")]
    assert len(printed) == 1, err  # once, from rank 0 (torchrun's report quotes error files)
    if how == "SIGINT to torchrun":  # torchrun forwards it to every worker
        assert f"stopped by SIGINT at update {stopped} of {MAX_UPDATES}" in err
    else:  # rank 0 did not get the signal itself; rank 1 told it through the all-reduce
        assert f"stopped by SIGTERM at update {stopped} of {MAX_UPDATES}" in err
        # Both workers in torchrun's report, unless torchrun lost its own race after they
        # stopped (each worker's own exit code is checked above either way).
        assert err.count(f"exitcode  : {code}") == 2 or torchrun_killpg_race(err), err
    assert "resume " + str(run) in err and "--nproc-per-node=2" in err
    assert "embodichain/core" not in err and "embodichain/cli" not in err  # no traceback of ours

    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=_env()))
    _assert_equals_reference(run, reference, events=[("stopped",), ("resumed", stopped)])
    print(f"{name}: stopped at update {stopped}, snapshot at {stopped}: 0 updates lost")


def test_damaged_last_pt_falls_back_to_the_newest_good_step_file(reference: Path,
                                                                 tmp_path: Path) -> None:
    """Catches a damaged last.pt not set aside (and recorded), records past step_200.pt
    not rolled back with their count, and any inexact state after the fall-back."""
    run = _copy_without_steps_after(reference, tmp_path / "run", 200)
    data = (run / "last.pt").read_bytes()
    (run / "last.pt").write_bytes(data[: len(data) // 2])  # torn by a crash
    proc = run_torchrun("resume", str(run), "--no-progress", env=_env())
    assert_ok(proc)
    assert "last.pt is damaged" in proc.stderr and "continuing from step_200.pt" in proc.stderr
    assert (run / "last.pt.damaged").read_bytes() == data[: len(data) // 2]
    beyond = len([r for r in read_metrics(reference / "metrics.jsonl").records
                  if r["step"] > 200])
    _assert_equals_reference(run, reference, events=[
        ("damaged_snapshots_set_aside",), ("rolled_back", 200, beyond), ("resumed", 200)])


def test_a_live_run_is_locked_against_resume_and_a_second_start(reference: Path,
                                                                tmp_path: Path) -> None:
    """The run is held inside update 10 until the three refused commands are done (not
    paced to outlast them), so it is live for each however loaded the machine. Catches a
    lock not taken, or not held for the whole run (a command not refused with exit 2
    naming the holder), and a refused command that disturbs the run (its outcome differs
    from the reference's)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    block, release = _block_env(tmp_path, 10)
    proc = _start(recipe, **block)
    try:
        _wait_for_file(release.with_name(release.name + ".reached"), proc)
        holder = json.loads((run / ".lock").read_text())
        for args in (["resume", str(run)], ["train-sl", "--config", str(recipe)],
                     ["train-sl", "--config", str(recipe), "--resume", "auto"]):
            refused = run_cli(*args, "--no-progress", env=_env())
            assert refused.returncode == 2, refused.stderr
            assert f"in use by a live run (held by pid {holder['pid']}" in refused.stderr
            assert proc.poll() is None
    finally:
        release.touch()
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, err
    _assert_equals_reference(run, reference, events=[])


def test_resume_of_a_finished_run_changes_nothing(reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = snapshot_dir(run)
    proc = run_torchrun("resume", str(run), "--no-progress", env=_env())
    assert_ok(proc)
    assert f"is complete: update {MAX_UPDATES} of {MAX_UPDATES}" in proc.stderr
    assert "trainer.max_updates" in proc.stderr  # how to extend it
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    for start in ("auto", str(run / "last.pt")):  # also --resume CKPT into its own directory
        proc = run_torchrun("train-sl", "--config", str(recipe), "--resume", start,
                            "--no-progress", env=_env())
        assert_ok(proc)
        assert "is complete" in proc.stderr
    assert snapshot_dir(run) == before


def test_resume_refuses_another_world_size_or_recipe_and_changes_nothing(
        reference: Path, tmp_path: Path) -> None:
    run = _copy_without_steps_after(reference, tmp_path / "run", 200)
    shutil.copyfile(run / "step_200.pt", run / "last.pt")  # records beyond it: to roll back
    before = snapshot_dir(run)
    proc = run_cli("resume", str(run), "--set", "optimizer.lr=0.5", "--no-progress",
                   env=_env())
    assert proc.returncode == 2, proc.stderr
    assert "world_size: checkpoint 2, this run 1" in proc.stderr
    assert "optimizer.lr: checkpoint 0.001, this run 0.5" in proc.stderr
    assert snapshot_dir(run) == before


def test_resume_ckpt_in_place_refuses_when_last_pt_is_newer(reference: Path,
                                                            tmp_path: Path) -> None:
    run = _copy_without_steps_after(reference, tmp_path / "run", 200)
    kept = [line for line in (run / "metrics.jsonl").read_text().splitlines(keepends=True)
            if json.loads(line)["step"] <= 200]
    (run / "metrics.jsonl").write_text("".join(kept))  # history not ahead; last.pt is at 300
    before = snapshot_dir(run)
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    proc = run_torchrun("train-sl", "--config", str(recipe), "--resume", str(run / "step_200.pt"),
                        "--no-progress", env=_env())
    assert proc.returncode == 1 and proc.stderr.count("exitcode  : 2") == 2, proc.stderr
    assert "last.pt (update 300)" in proc.stderr
    assert snapshot_dir(run) == before


def test_resume_ckpt_into_its_own_directory_names_the_resume_command(reference: Path,
                                                                     tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    before = snapshot_dir(run)
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    proc = run_torchrun("train-sl", "--config", str(recipe), "--resume", str(run / "step_200.pt"),
                        "--no-progress", env=_env())
    assert proc.returncode == 1 and proc.stderr.count("exitcode  : 2") == 2, proc.stderr
    assert "already has records up to update 300" in proc.stderr
    assert f"torchrun --standalone --nproc-per-node=2 -m embodichain resume {run}" in proc.stderr
    # torchrun's own summary shows our message as the root cause, not <N/A>
    root_cause = proc.stderr.split("Root Cause")[1]
    assert "<N/A>" not in root_cause.split("=====")[1] and "already has records" in root_cause
    assert snapshot_dir(run) == before
