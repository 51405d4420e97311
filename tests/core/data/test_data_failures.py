"""Loading failures under torchrun (R-DATA-4): a `__getitem__` that raises, a data worker
SIGKILLed. Every rank exits non-zero promptly (none waits in the all-reduce), and the
message names the example or the worker, and the last snapshot."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.manifest import checkpoint_step
from embodichain.core.data.samplers import ReplacementSampler
from embodichain.core.runs.run_dir import read_metrics
from tests.support import child_pids, run_torchrun, start_python_module, torchrun_workers
from tests.support.data import data_env, data_recipe

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

TRAIN_SIZE, BATCH = 1024, 32


def _first_update_drawing(index: int, updates: int = 200) -> int | None:
    """The first update at which either rank draws `index` (seed 0, as the recipe)."""
    samplers = [ReplacementSampler(TRAIN_SIZE, BATCH, 0, rank) for rank in (0, 1)]
    for update in range(1, updates + 1):
        if any(index in s.next_indices().tolist() for s in samplers):
            return update
    return None




def _rank_process(agent: int, rank: int) -> int:
    workers = torchrun_workers(agent)
    assert rank in workers, f"no worker of rank {rank} under {agent}"
    return workers[rank]


def test_an_example_that_raises_stops_every_rank_naming_it(tmp_path: Path) -> None:
    """Catches a failure that hangs the other rank in the all-reduce, or that is reported
    without the example's index, the dataset's own message or the snapshot to go back to."""
    index, update = next((i, u) for i in range(TRAIN_SIZE)
                         if (u := _first_update_drawing(i)) is not None and 13 <= u <= 40)
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **{
        "trainer.max_updates": 60, "trainer.save_every": 5, "trainer.data_workers": 2})
    started = time.monotonic()
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=data_env(EMBODICHAIN_TEST_FAIL_INDEX=str(index)))
    elapsed = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert f"loading example {index} failed" in output, output
    assert f"update {update}" in output and f"ValueError: corrupt record {index} (test)" in output
    snapshot = (update - 1) // 5 * 5
    # The one `resume` continues from: last.pt, of that update.
    assert f"the last snapshot is {run / 'last.pt'}" in output, output
    assert checkpoint_step(run / "last.pt") == snapshot
    assert read_metrics(run / "metrics.jsonl").last_step == snapshot
    print(f"example {index} failed at update {update}; torchrun exited after {elapsed:.1f} s")


def test_a_sigkilled_data_worker_stops_every_rank_naming_it(tmp_path: Path) -> None:
    """Catches a dead data worker that leaves its rank waiting for the batch forever (and
    the other rank in the all-reduce), or a message that does not say what died."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **{
        "trainer.max_updates": 100_000, "trainer.save_every": 5, "trainer.log_every": 1,
        "trainer.validate_every": 0, "trainer.data_workers": 2})
    command = ["--standalone", "--nnodes=1", "--nproc-per-node=2", "--monitor-interval=0.2",
               "-m", "embodichain", "train-sl", "--config", str(recipe), "--no-progress"]
    proc = start_python_module("torch.distributed.run", *command,
                               env=data_env(EMBODICHAIN_TEST_SLEEP_S="0.05"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not ((run / "metrics.jsonl").exists()
                   and (read_metrics(run / "metrics.jsonl").last_step or 0) >= 12):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        victim = child_pids(_rank_process(proc.pid, 1))[0]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        output = proc.communicate(timeout=120)[0]
        elapsed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, output
    assert "a data worker process died (rank 1" in output, output
    # torch names the dead worker one of two ways, depending on which of its checks sees
    # the death first (the SIGCHLD handler, or the queue's timeout check)
    assert (f"DataLoader worker (pid {victim}) is killed by signal: Killed" in output
            or f"DataLoader worker (pid(s) {victim}) exited unexpectedly" in output), output
    assert "the last snapshot is " in output and "last.pt" in output, output
    print(f"torchrun exited {elapsed:.1f} s after the data worker's SIGKILL")
