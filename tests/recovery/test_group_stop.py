"""R-PREEMPT-1: a stop signal to every process of the job, data workers included, loses no work.

A batch system stops a job by signalling all of its processes (SLURM's preemption and
`scancel`, `timeout`, a container stop), and torch's elastic agent passes a signal on to
each worker's whole process group, data workers included. Each test trains the augmenting
recipe (a `DatasetSource`, 2 DataLoader workers per rank) in a session of its own, slowed to
0.2 s per update, and signals it once metrics.jsonl shows progress: `os.killpg` of the
launcher's group, as `kill -TERM -- -PGID` does (or of every process group of the job, as
SLURM does). The broken variant, data workers that die of a signal meant for their rank,
ends every test the same way: "a data worker process died ... no snapshot was saved", exit
1, no last.pt. Then: every rank stopped at the same update, last.pt holds it, `runs` says
"stopped cleanly", every process of the job (the data workers too) has ended, and `resume`
finishes bitwise equal to the uninterrupted run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics
from embodichain.core.runs.run_lock import lock_holder
from tests.support import TIMEOUT, assert_ok, child_pids, run_cli, run_torchrun
from tests.support.data import data_env, data_recipe
from tests.support.processes import start_python_module
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # every test launches a run with data workers and signals it

MAX_UPDATES = 40
RECIPE = {"trainer.max_updates": MAX_UPDATES, "trainer.save_every": 20,
          "trainer.validate_every": 20, "trainer.data_workers": 2}
PACE = {"EMBODICHAIN_TEST_SLEEP_S": "0.2"}  # time to signal mid-run; results unchanged
STOPPED = re.compile(r"stopped by (SIG\w+) at update (\d+) of (\d+): saved (\S+) \(update "
                     r"(\d+)\), so no work is lost")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            "--nproc-per-node=2", "-m", "embodichain"]
EMBODICHAIN = [sys.executable, "-m", "embodichain"]
DATA_WORKER = "pt_data_worker"  # the name torch gives its data workers (/proc/PID/comm)


def _reference(root: Path, *launch: str) -> Path:
    recipe = data_recipe(root / "r.yaml", root / "run", **RECIPE)
    launcher = run_torchrun if launch == ("torchrun",) else run_cli
    assert_ok(launcher("train-sl", "--config", str(recipe), "--no-progress", env=data_env()))
    return root / "run"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe trained by 2 ranks under torchrun, uninterrupted."""
    return _reference(tmp_path_factory.mktemp("group_stop_two"), "torchrun")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe trained by one process, uninterrupted."""
    return _reference(tmp_path_factory.mktemp("group_stop_one"), "one")


def _descendants(pid: int) -> list[int]:
    found = []
    for child in child_pids(pid):
        found += [child, *_descendants(child)]
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a zombie left for init to reap has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def _signal_mid_run(cmd: list[str], run: Path, tmp_path: Path, sig: int, *, data_workers: int,
                    every_process: bool = False, **env: str) -> tuple[int, str]:
    """Start `cmd` in a session of its own, wait until metrics.jsonl shows 2 records and
    `data_workers` data workers run, then send `sig` to the launcher's process group (and,
    `every_process`, to every process group of the job, as SLURM signals every process).
    Returns the launcher's exit code and what the run printed, once every process of the
    job has ended (the data workers end with their rank: within 10 s)."""
    out = (tmp_path / "out.txt").open("w")
    proc = start_python_module(cmd[2], *cmd[3:], stdout=out, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True, env=data_env(**PACE, **env))
    job: list[int] = []
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            assert proc.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.monotonic() < deadline, "the run never showed progress"
            log = run / "metrics.jsonl"
            if log.exists() and len(log.read_text().splitlines()) >= 2:
                job = _descendants(proc.pid)
                if sum(_name(pid) == DATA_WORKER for pid in job) == data_workers:
                    break
            time.sleep(0.05)
        for group in {proc.pid} | ({os.getpgid(p) for p in job} if every_process else set()):
            os.killpg(group, sig)
        signalled = time.monotonic()
        code = proc.wait(timeout=TIMEOUT)
        ended = time.monotonic()
        launcher = "torchrun" if "torch.distributed.run" in cmd else \
            "self-launch" if "--nproc-per-node" in cmd else "one process"
        print(f"{signal.Signals(sig).name} to {launcher}: it exited "
              f"{ended - signalled:.1f} s later")
        while any(_alive(pid) for pid in job) and time.monotonic() < ended + 10:
            time.sleep(0.05)
        left = {pid: _name(pid) for pid in job if _alive(pid)}
        assert not left, f"processes of the job alive 10 s after its launcher ended: {left}"
    finally:
        for pid in [proc.pid, *job]:
            if _alive(pid):  # leave nothing behind a failed test
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        out.close()
    return code, (tmp_path / "out.txt").read_text()


def _stopped_cleanly(run: Path, printed: str, sig: int) -> int:
    """The update every rank stopped at: printed once, last.pt holds it, nothing recorded
    after it, the lock free, and `runs` shows the clean stop. Returns it."""
    stops = STOPPED.findall(printed)
    assert len(stops) == 1, printed
    name, step, of, saved, saved_step = stops[0]
    assert (name, int(of), saved, saved_step) == (signal.Signals(sig).name, MAX_UPDATES,
                                                 str(run / "last.pt"), step), printed
    step = int(step)
    assert 10 <= step < MAX_UPDATES, printed
    assert "data worker" not in printed and "interrupted at once" not in printed, printed
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == step
    assert (read_metrics(run / "metrics.jsonl").last_step or 0) <= step
    assert lock_holder(run) is None
    listed = run_cli("runs", str(run.parent), "--json")
    assert_ok(listed)
    (row,) = [r for r in json.loads(listed.stdout) if Path(r["directory"]) == run]
    assert row["state_text"] == f"stopped cleanly at update {step} ({name})", row
    return step


def _resumes_exactly(run: Path, reference: Path, resume) -> None:
    assert_ok(resume())
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == MAX_UPDATES
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 6
    assert comparable_records(run) == comparable_records(reference)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_every_process_under_torchrun_stops_with_a_snapshot(
        sig: int, two_ranks: Path, tmp_path: Path) -> None:
    """2 ranks x 2 data workers under torchrun. SIGTERM goes to torchrun's process group
    (`kill -TERM -- -PGID`: the agent passes it on to each rank's group, data workers
    included); SIGINT goes to every process group of the job (as SLURM's
    `scancel --signal=INT` signals every process), so each rank gets it twice, from the
    batch system and from the agent. Catches data workers that die of their rank's signal
    ("a data worker process died ... no snapshot", exit 1) and, for SIGINT, the second
    delivery taken for a second Ctrl-C ("interrupted at once", no snapshot). torchrun
    itself exits 1 (its own SignalException; it reports no worker code then)."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **RECIPE)
    code, printed = _signal_mid_run([*TORCHRUN, "train-sl", "--config", str(recipe),
                                     "--no-progress"], run, tmp_path, sig, data_workers=4,
                                    every_process=sig == signal.SIGINT)
    assert code == 1, printed
    assert "SignalException: Process" in printed and f"got signal: {int(sig)}" in printed
    _stopped_cleanly(run, printed, sig)
    _resumes_exactly(run, two_ranks, lambda: run_torchrun("resume", str(run), "--no-progress",
                                                          env=data_env()))


def test_ctrl_c_to_a_self_launched_run_stops_with_a_snapshot_and_exits_130(
        two_ranks: Path, tmp_path: Path) -> None:
    """`train-sl --nproc-per-node 2` (torch's elastic agent in this process) with 2 data
    workers per rank; SIGINT to its process group, as Ctrl-C in a terminal sends. Catches
    data workers killed by the SIGINT the agent passes on to each rank's group, and a
    launcher that exits other than 130. The same command with `--resume auto` continues
    bitwise."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **RECIPE)
    train = ["train-sl", "--config", str(recipe), "--nproc-per-node", "2", "--no-progress"]
    code, printed = _signal_mid_run([*EMBODICHAIN, *train], run, tmp_path, signal.SIGINT,
                                    data_workers=4)
    assert code == 130, printed
    assert "Traceback" not in printed, printed
    _stopped_cleanly(run, printed, signal.SIGINT)
    _resumes_exactly(run, two_ranks, lambda: run_cli(*train, "--resume", "auto",
                                                     env=data_env()))


def test_sigterm_to_one_process_and_its_data_workers_stops_with_a_snapshot(
        one_process: Path, tmp_path: Path) -> None:
    """One process (no torchrun) with 2 data workers, its whole process group SIGTERMed
    (`timeout`, a container stop): catches data workers dying of it (torch's worker handler
    dies of a SIGTERM its parent did not send), exit other than 143. `resume` continues
    bitwise."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **RECIPE)
    code, printed = _signal_mid_run([*EMBODICHAIN, "train-sl", "--config", str(recipe),
                                     "--no-progress"], run, tmp_path, signal.SIGTERM,
                                    data_workers=2)
    assert code == 143, printed
    _stopped_cleanly(run, printed, signal.SIGTERM)
    _resumes_exactly(run, one_process, lambda: run_cli("resume", str(run), "--no-progress",
                                                       env=data_env()))


def test_sigterm_to_torchrun_under_fsdp_and_a_global_batch_stops_with_a_snapshot(
        tmp_path: Path) -> None:
    """A leaner check of the other paths a stop takes: `trainer.strategy: fsdp` (every rank
    writes its shard of the snapshot) under `trainer.global_batch_size` (each update loaded
    as K micro-batches in turn by the data workers). Catches data workers dying of the
    signal on either path, and ranks that stop at different updates (the sharded snapshot
    would not verify)."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **RECIPE, **{
        "trainer.strategy": "fsdp", "trainer.global_batch_size": 128})
    code, printed = _signal_mid_run([*TORCHRUN, "train-sl", "--config", str(recipe),
                                     "--no-progress"], run, tmp_path, signal.SIGTERM,
                                    data_workers=4)
    assert code == 1, printed
    _stopped_cleanly(run, printed, signal.SIGTERM)
