"""R-OPS-1: a stuck rank is named, within `trainer.collective_timeout`.

Two gloo ranks under torchrun. Rank 1 freezes itself with SIGSTOP inside update 45 (as a
stuck read or a hung GPU freezes a rank; tests/factories/restarting.py): rank 0 waits for it
in the update's all-reduce. The broken variant, torch's own 30-minute timeout with no word,
fails the first assertion: no message within the timeout + 30 s; one that leaves the stopped
rank to torchrun's SIGTERM fails the next: torchrun does not end within it. Then: one message naming
rank 1, the update and where rank 0 waited; RUN/hang/rank_0.txt holds rank 0's stack and
rank_1.txt says why rank 1 left none; the last snapshot verifies, and `resume` finishes
bitwise equal to the uninterrupted run. A data worker that hangs in `__getitem__` is named as
such by its rank, before the other rank's watch would fire.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.manifest import checkpoint_step
from embodichain.core.data.samplers import ReplacementSampler
from tests.support import (
    RESTART_RECIPE,
    assert_ok,
    run_torchrun,
    start_python_module,
    torchrun_workers,
    write_recipe,
)
from tests.support.data import data_env, data_recipe
from tests.support.processes import factories_env
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # each test launches torchrun workers

TIMEOUT_S = 4  # trainer.collective_timeout of the frozen run
FREEZE_AT = 45  # rank 1 stops inside this update; the last snapshot is update 40
FROZE = "[test] SIGSTOP rank 1 in update 45"
HANGS = "error: training hangs: update 45 waited more than trainer.collective_timeout (4 s)"


def _seen(out: Path, text: str, proc: subprocess.Popen, deadline: float) -> float:
    """When `text` first shows in the launch's output (polled)."""
    while text not in out.read_text():
        assert proc.poll() is None or text in out.read_text(), out.read_text()
        assert time.monotonic() < deadline, f"never printed {text!r}:\n{out.read_text()}"
        time.sleep(0.05)
    return time.monotonic()


def _end_everything(proc: subprocess.Popen, workers: dict[int, int]) -> None:
    """Leave nothing behind: a frozen worker is continued first, so that a kill ends it."""
    for pid in workers.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in workers.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_a_frozen_rank_is_named_with_every_stack_and_the_run_resumes_exactly(
        tmp_path: Path, restart_reference: Path) -> None:
    """Catches a hang left to torch's timeout (no message in time), a message that does not
    name the missing rank, the update or rank 0's place, a missing stack file, and a last
    snapshot that the hang damaged or that does not resume bitwise."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RESTART_RECIPE,
                          **{"trainer.collective_timeout": f"{TIMEOUT_S}s"})
    out = tmp_path / "out.txt"
    with out.open("w") as sink:
        proc = start_python_module(
            "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2", "-m",
            "embodichain", "train-sl", "--config", str(recipe), "--no-progress",
            env=factories_env(EMBODICHAIN_TEST_FREEZE_AT=str(FREEZE_AT)), stdout=sink,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workers: dict[int, int] = {}
    try:
        froze = _seen(out, FROZE, proc, time.monotonic() + 240)
        workers = torchrun_workers(proc.pid)
        said = _seen(out, HANGS, proc, froze + TIMEOUT_S + 30)
        # Rank 0 ends the stopped rank itself: left to torchrun, the launch would end only
        # 30 s after its SIGTERM, which a stopped process cannot take (timeout + 33 s).
        code = proc.wait(timeout=max(1.0, froze + TIMEOUT_S + 30 - time.monotonic()))
        ended = time.monotonic()
        print(f"the hang was named {said - froze:.1f} s and torchrun ended "
              f"{ended - froze:.1f} s after rank 1 froze")
        assert code == 1, out.read_text()
        stacks = [(run / "hang" / f"rank_{r}.txt").read_text() for r in (0, 1)]
    finally:
        _end_everything(proc, workers)
    printed = out.read_text()
    assert printed.count("training hangs:") == 1, printed
    line = next(x for x in printed.splitlines() if x.startswith(HANGS))
    assert "Rank 1 did not arrive: rank 1 does not answer (pid " in line, line
    assert "state T (stopped)" in line, line
    assert "Rank 1, stopped by a signal, ended with SIGKILL" in line, line
    assert "Rank 0 was waiting at torch/" in line, line  # in the all-reduce, inside torch
    assert f"{run / 'hang'}/rank_N.txt" in line, line
    assert f"The last snapshot is {run / 'last.pt'}; continue with: " in line, line
    assert f"resume {run}" in line, line
    stack_0, stack_1 = stacks
    assert stack_0.startswith(f"rank 0 of 2, update {FREEZE_AT}, pid "), stack_0
    assert "The main thread" in stack_0 and "in _update" in stack_0, stack_0
    assert "Every thread (faulthandler):" in stack_0, stack_0
    assert stack_1.startswith("Rank 1 does not answer (pid "), stack_1
    assert checkpoint_step(run / "last.pt") == 40  # intact, and what resume continues from

    assert_ok(run_torchrun("resume", str(run), "--no-progress", "--set",
                           "trainer.collective_timeout=5m", env=factories_env()))
    assert assert_training_state_equal(restart_reference / "last.pt", run / "last.pt") >= 6
    assert comparable_records(run) == comparable_records(restart_reference)


def _rank_and_update_drawing(train_size: int, batch: int) -> tuple[int, int, int]:
    """An example index, the one rank and the update that first draw it, past the first
    updates (so that the watch is armed too: the data worker's timeout must come first)."""
    samplers = [ReplacementSampler(train_size, batch, 0, rank) for rank in (0, 1)]
    seen: set[int] = set()
    for update in range(1, 200):
        drawn = [set(s.next_indices().tolist()) for s in samplers]
        if update >= 6:
            for rank in (0, 1):
                fresh = drawn[rank] - seen - drawn[1 - rank]
                if fresh:
                    return min(fresh), rank, update
        seen |= drawn[0] | drawn[1]
    raise AssertionError("every index was drawn in the first updates")


def test_a_data_worker_that_hangs_in_getitem_is_named(tmp_path: Path) -> None:
    """Catches a hung `__getitem__` that holds the run until a collective times out, or that
    is reported as a stuck rank (or a plain failure) instead of a hung data worker. One
    worker: with several, every batch another worker delivers restarts the DataLoader's
    timeout, and the watch names the rank that waits for its data workers instead (see
    test_hang_report)."""
    index, rank, update = _rank_and_update_drawing(1024, 32)
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **{
        "trainer.max_updates": 60, "trainer.save_every": 5, "trainer.data_workers": 1,
        "trainer.collective_timeout": 8})
    started = time.monotonic()
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", timeout=180,
                        env=data_env(EMBODICHAIN_TEST_HANG_INDEX=str(index)))
    output = proc.stdout + proc.stderr
    print(f"example {index} hung on rank {rank} at update {update}; torchrun exited after "
          f"{time.monotonic() - started:.1f} s")
    assert proc.returncode == 1, output
    assert (f"a data worker hangs (rank {rank}, update {update}): no batch came within 4 s "
            "(half of trainer.collective_timeout); it is stuck in the dataset's __getitem__"
            in output), output
    assert "training hangs:" not in output, output
    assert checkpoint_step(run / "last.pt") == (update - 1) // 5 * 5
