"""R-PROC-1: a worker whose launcher dies stops with a snapshot, and the run resumes exactly.

torch's agent starts each worker in a session of its own, so a SIGKILL of torchrun (or of a
self-launched run's process group) reaches no worker. Without the launcher watch the workers
train on as orphans holding the lock (the broken variant: they are still alive after 10 s,
and the `resume` that follows is refused). Each test blocks both ranks at a known update
(tests/factories/blocking.py), kills the launcher alone, lets the ranks go, and checks that
every worker is gone within 10 s, that last.pt holds that update, and that `resume DIR`
right away finishes bitwise equal to an uninterrupted run. The last test covers the other
way a worker outlives its stop (R-PROC-3): a SIGTERM while it waits in a collective for a
rank that hangs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics
from embodichain.core.runs.run_lock import lock_holder
from tests.support import (
    REPO,
    assert_ok,
    run_cli,
    run_torchrun,
    worker_env,
    write_recipe,
)
from tests.support.processes import start_python_module, torchrun_workers
from tests.support.state_compare import (
    assert_same_outcome,
    assert_training_state_equal,
    comparable_records,
    implied_events,
)

FACTORIES = REPO / "tests" / "factories"
MAX_UPDATES, BLOCK_AT = 120, 55
RECIPE = {"factory": "blocking:build_supervised_trainer", "trainer.max_updates": MAX_UPDATES,
          "trainer.save_every": 40, "trainer.validate_every": 50, "trainer.log_every": 10}

pytestmark = pytest.mark.slow


def _env(**extra: str) -> dict[str, str]:
    return worker_env(PYTHONPATH=str(FACTORIES), **extra)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The blocking recipe trained without interruption (no block) by 2 workers."""
    root = tmp_path_factory.mktemp("launcher_death_reference")
    recipe = write_recipe(root / "r.yaml", root / "run", **RECIPE)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=_env()))
    return root / "run"




def _alive(pid: int) -> bool:
    """Running (a zombie left for init to reap has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _torchrun_train(recipe: Path) -> list[str]:
    """`torchrun --standalone --nproc-per-node=2 -m embodichain train-sl --config RECIPE`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            "--nproc-per-node=2", "-m", "embodichain", "train-sl", "--config", str(recipe),
            "--no-progress"]


def _start(cmd: list[str], tmp_path: Path, fresh: bool = False, **env: str
           ) -> tuple[subprocess.Popen, IO[str]]:
    """`cmd` (`python -m MODULE ...`) in a session of its own, its output to
    tmp_path/out.txt (the open file); forked warm unless `fresh`."""
    out = (tmp_path / "out.txt").open("w")
    proc = start_python_module(cmd[2], *cmd[3:], stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True, env=_env(**env), fresh=fresh)
    return proc, out


def _wait_for_the_block(proc: subprocess.Popen, release: Path, tmp_path: Path) -> None:
    """Until both ranks wait at BLOCK_AT (tests/factories/blocking.py)."""
    deadline = time.monotonic() + 240
    while not all(Path(f"{release}.rank{r}").exists() for r in (0, 1)):
        assert proc.poll() is None, (tmp_path / "out.txt").read_text()
        assert time.monotonic() < deadline, "the ranks never reached the block"
        time.sleep(0.05)


def _kill_launcher_at_the_block(cmd: list[str], run: Path, tmp_path: Path, *, group: bool,
                                fresh: bool = False) -> tuple[float, str]:
    """Start `cmd`, wait until both ranks wait at BLOCK_AT, SIGKILL the launcher (its whole
    process group if `group`), let the ranks go; returns the seconds from the kill to the
    last worker's end, and what the run printed."""
    release = tmp_path / "release"
    proc, out = _start(cmd, tmp_path, fresh, EMBODICHAIN_TEST_BLOCK_AT=str(BLOCK_AT),
                       EMBODICHAIN_TEST_BLOCK_FILE=str(release),
                       # an orphan that trained on would outlive the deadline
                       EMBODICHAIN_TEST_PACE_S="0.25")
    try:
        _wait_for_the_block(proc, release, tmp_path)
        workers = list(torchrun_workers(proc.pid).values())
        assert len(workers) == 2, workers
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=30)
        time.sleep(0.5)  # the update at the block is the last one before the kill...
        release.touch()  # ... and the ranks go on only now
        while any(_alive(pid) for pid in workers) and time.monotonic() < killed + 10:
            time.sleep(0.02)
        seconds = time.monotonic() - killed
        left = [pid for pid in workers if _alive(pid)]
        for pid in left:  # do not leave orphans behind a failed test
            os.kill(pid, signal.SIGKILL)
        assert not left, f"workers {left} still alive 10 s after their launcher was killed"
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    return seconds, (tmp_path / "out.txt").read_text()


def _check_stopped_then_resume(run: Path, printed: str, resume, reference: Path) -> None:
    stopped = read_checkpoint(run / "last.pt")["manifest"]["step"]
    assert BLOCK_AT - 1 <= stopped < MAX_UPDATES, printed
    assert (read_metrics(run / "metrics.jsonl").last_step or 0) <= stopped  # nothing after
    assert f"stopped by SIGTERM at update {stopped}" in printed
    assert lock_holder(run) is None  # released: the next command may start at once
    assert_ok(resume())
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == MAX_UPDATES
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 18
    assert comparable_records(run) == comparable_records(reference)
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_sigkill_of_the_torchrun_agent_stops_its_workers_with_a_snapshot(
        reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    # Fresh: torchrun itself is the workers' parent, as in production (warm, it would be the
    # harness's worker server, which only mimics its agent's death); this slow test is not
    # among those CI runs fresh (`fresh_workers`).
    seconds, printed = _kill_launcher_at_the_block(_torchrun_train(recipe), run, tmp_path,
                                                   group=False, fresh=True)
    print(f"torchrun agent SIGKILLed: last worker ended {seconds:.2f} s later")
    _check_stopped_then_resume(
        run, printed, lambda: run_torchrun("resume", str(run), "--no-progress", env=_env()),
        reference)


def test_sigkill_of_a_self_launched_process_group_stops_its_workers_with_a_snapshot(
        reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    cmd = [sys.executable, "-m", "embodichain", "train-sl", "--config", str(recipe),
           "--nproc-per-node", "2", "--no-progress"]
    seconds, printed = _kill_launcher_at_the_block(cmd, run, tmp_path, group=True)
    print(f"self-launched process group SIGKILLed: last worker ended {seconds:.2f} s later")
    # the same command again, with --resume auto, continues it (as a requeued job would)
    _check_stopped_then_resume(
        run, printed, lambda: run_cli("train-sl", "--config", str(recipe), "--resume", "auto",
                                      "--nproc-per-node", "2", "--no-progress", env=_env()),
        reference)


def test_sigterm_while_a_rank_hangs_ends_the_waiting_rank_promptly(reference: Path,
                                                                   tmp_path: Path) -> None:
    """R-PROC-3: rank 0 hangs (SIGSTOP) at BLOCK_AT while rank 1 goes into that update's
    all-reduce; then torchrun gets SIGTERM and passes it on. Rank 1 cannot run its Python
    handler in the collective: the broken variant (no watch of a stuck wait in training)
    waits there until torchrun's SIGKILL 30 s later, `Signal 9` and no word. Here it ends
    itself after the grace (TRAINING_GRACE_S, 10 s) with 143 and a line naming the update;
    rank 0, let go, finds it gone and stops too without a snapshot (143, the last one kept).
    `resume DIR` then rolls back the records after that snapshot and ends bitwise equal to
    the uninterrupted run."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    release = tmp_path / "release"
    proc, out = _start(_torchrun_train(recipe), tmp_path,
                       EMBODICHAIN_TEST_BLOCK_AT=str(BLOCK_AT),
                       EMBODICHAIN_TEST_BLOCK_FILE=str(release))
    ranks: dict[int, int] = {}
    try:
        _wait_for_the_block(proc, release, tmp_path)
        ranks.update(torchrun_workers(proc.pid))
        os.kill(ranks[0], signal.SIGSTOP)  # rank 0 hangs before update BLOCK_AT
        release.touch()
        time.sleep(1.5)  # rank 1 computes its part and waits for rank 0 in the all-reduce
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        while _alive(ranks[1]) and time.monotonic() < sent + 25:
            time.sleep(0.05)
        seconds = time.monotonic() - sent
        assert not _alive(ranks[1]), "rank 1 still waits 25 s after SIGTERM"
        print(f"SIGTERM while rank 0 hangs: rank 1 ended {seconds:.2f} s later")
        assert seconds < 20, seconds
        os.kill(ranks[0], signal.SIGCONT)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in ranks.values():
            if _alive(pid):  # a failed test leaves no stopped or orphaned worker behind
                os.kill(pid, signal.SIGKILL)
        out.close()
    printed = (tmp_path / "out.txt").read_text()
    assert (f"[rank 1] stopped by SIGTERM while waiting for the other ranks in update "
            f"{BLOCK_AT}: the updates after the last snapshot are lost") in printed, printed
    assert (f"stopped by SIGTERM at update {BLOCK_AT - 1} of {MAX_UPDATES}, but another rank "
            "ended before the stop's snapshot could be taken") in printed, printed
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 40  # save_every: 40
    assert lock_holder(run) is None
    events = implied_events(run, 40)
    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=_env()))
    assert_same_outcome(run, reference, events=events)


def test_sigterm_during_a_long_validation_still_ends_with_a_snapshot(tmp_path: Path) -> None:
    """R-PROC-3's other side: rank 0 validates update 50 for 14 s while rank 1 waits for it
    in a collective, and torchrun passes on a SIGTERM meanwhile. Rank 0 is not hung, so the
    stop must still end with a snapshot: rank 1 may end itself only after RANK_ZERO_GRACE_S
    (25 s). The broken variant (the update's 10 s grace for every wait) ends rank 1 at 10 s,
    and rank 0 then stops without a snapshot ("another rank ended before ...")."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RECIPE)
    release = tmp_path / "release"
    proc, out = _start(_torchrun_train(recipe), tmp_path,
                       EMBODICHAIN_TEST_BLOCK_FILE=str(release),
                       EMBODICHAIN_TEST_SLOW_VALIDATION_AT="50",
                       EMBODICHAIN_TEST_SLOW_VALIDATION_S="14")
    try:
        deadline = time.monotonic() + 240
        while not Path(f"{release}.validating").exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "out.txt").read_text()
            time.sleep(0.05)
        time.sleep(0.5)  # rank 1 is in the validation's broadcast, waiting for rank 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    printed = (tmp_path / "out.txt").read_text()
    assert "another rank ended" not in printed and "while waiting for" not in printed, printed
    # The stop rides update 51's all-reduce and is read after update 52 (R-GPU-1: an
    # update's figures are read during the next one).
    assert f"stopped by SIGTERM at update 52 of {MAX_UPDATES}: saved" in printed, printed
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 52
