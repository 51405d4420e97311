"""Known traps: torch 2.13 can abort at interpreter exit (SIGABRT, "terminate called without
an active exception") when a process group outlives `destroy_process_group` with its gloo
threads running: when a DistributedDataParallel object outlives the group (seen in 6 of 20
launches of a plain 2-worker gloo script), and when `torch.distributed.nn.functional`, which
torch.optim imports lazily, is first imported after the group exists and binds it as default
arguments (about 1 in 30 long runs on a busy machine, R-PROC-2). The framework releases the
DDP wrapper before destroying the group and imports that module first. A third: the group
dying on one of its own gloo threads, whose destructor then joins itself (SIGABRT, "Resource
deadlock avoided"; 1 CI run in 3 on a loaded machine): the DDP communication hook's future
callback, dropped on that thread, must hold nothing that holds the group.

Either trap leaves the group's gloo threads running after the run, which
`test_no_gloo_thread_is_left_after_a_run` sees in every launch (no luck needed). The
launches below, two at a time on 2 cores, check that short runs end with exit 0 on every
rank and record identical metrics; counting rare aborts over many runs is the job of
`benchmarks/stress_exit.py` (`--runs 40 --load 2`).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from embodichain.core.runs.measured import is_measured
from tests.support import (
    CPU_RECIPE,
    SCRIPTS,
    run_python_module,
    run_torchrun,
    worker_env,
)

LAUNCHES = 2  # one pair, two at a time: two runs' workers racing each other at all
# (a trap itself is caught in every launch by test_no_gloo_thread_is_left_after_a_run;
# counting its rare aborts takes benchmarks/stress_exit.py's 40 runs, not a few here)
SHORT = ["--set", "trainer.max_updates=20", "--set", "trainer.save_every=10",
         "--set", "trainer.validate_every=10", "--no-progress"]


@pytest.mark.slow
def test_no_gloo_thread_is_left_after_a_run(tmp_path: Path) -> None:
    """Catches a group that destroy_process_group cannot free (its threads then run into
    interpreter exit): importing torch.distributed.nn.functional after the group exists
    leaves two `pt_gloo_runloop` threads and a `gloo_tcp_loop` in every worker."""
    proc = run_python_module("torch.distributed.run", "--standalone", "--nnodes=1",
                             "--nproc-per-node=2", str(SCRIPTS / "gloo_threads_after_run.py"),
                             str(tmp_path / "run"))  # a script: its workers are fresh
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("gloo threads left: []") == 2, proc.stdout + proc.stderr


def test_the_reduce_state_holding_the_group_dies_on_the_main_thread() -> None:
    """Catches a communication hook whose future callback holds the reduce state (and so the
    group): gloo's worker thread, descheduled before it drops the callback, then frees the
    state itself, after `release()` (5-9 of 30 rounds a rank, with both ranks pinned to one
    CPU by tests/scripts/reduce_state_lifetime.py; 0 with the callback holding the result only),
    and after `destroy_process_group` the group with it, joining its own thread."""
    # worker_env puts the caller's PYTHONPATH after SCRIPTS itself
    proc = run_torchrun(module="reduce_state_lifetime", env=worker_env(PYTHONPATH=str(SCRIPTS)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"rank {rank}: freed on other threads: 0 of 30" in proc.stdout, proc.stdout


def comparable(metrics: Path) -> list[dict]:
    """metrics.jsonl without wall-clock values (keys under `time/`)."""
    return [{k: v for k, v in json.loads(line).items() if not is_measured(k)}
            for line in metrics.read_text().splitlines()]


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """LAUNCHES short runs, two at a time: on 2 cores the pair's four workers load the CPU
    for each other (the aborts were timing races, seen on busy machines), in half the time
    of one launch after another beside a busy loop. All of them, even after a failure: the
    count is the finding."""
    root = tmp_path_factory.mktemp("exit_trap")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda i: _launch(root / f"run{i:02d}", i), range(LAUNCHES)))


def _launch(out: Path, i: int) -> dict:
    proc = run_torchrun("train-sl", "--config", str(CPU_RECIPE),
                        "--set", f"trainer.output_dir={out}", *SHORT)
    return {"launch": i, "returncode": proc.returncode,
            "output": (proc.stdout + proc.stderr)[-3000:], "dir": out}


@pytest.mark.slow
def test_two_worker_launches_all_exit_0(launches):
    failed = [r for r in launches if r["returncode"] != 0]
    assert not failed, f"{len(failed)} of {LAUNCHES} launches failed; first:\n" \
                       f"exit {failed[0]['returncode']}\n{failed[0]['output']}"
    for r in launches:
        assert "terminate called" not in r["output"], r["output"]
        assert (r["dir"] / "last.pt").is_file() and (r["dir"] / "step_20.pt").is_file()


@pytest.mark.slow
def test_repeated_launches_record_identical_metrics(launches):
    """R-RUN-3: every value not under `time/` is a function of the recipe and the step."""
    runs = [comparable(r["dir"] / "metrics.jsonl") for r in launches if r["returncode"] == 0]
    assert len(runs) >= 2
    first = runs[0]
    assert [r["step"] for r in first if "validation/mse" in r] == [10, 20]
    for other in runs[1:]:
        assert other == first
