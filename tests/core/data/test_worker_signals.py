"""Data workers ignore their rank's stop signals and still end with it (R-PREEMPT-1), in one
process: the signals sent to the workers directly, their end by `close()` and at exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.samplers import ReplacementSampler
from tests.factories.augmenting import AugmentingDataset
from tests.support import REPO, child_pids, worker_env

CPU = torch.device("cpu")
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _corpus(n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(n, 4, generator=g), "y": torch.randn(n, 2, generator=g),
            "mask": torch.ones(n, 2)}


def _loader(dataset, workers: int, prefetch: int = 2) -> BatchLoader:
    return BatchLoader(DatasetSource(dataset, identity="test"),
                       ReplacementSampler(len(dataset), 8, 7, 0), CPU, seed=7, rank=0,
                       workers=workers, prefetch=prefetch)


def _data_workers() -> list[int]:
    return [pid for pid in child_pids(os.getpid())
            if Path(f"/proc/{pid}/comm").read_text().strip() == "pt_data_worker"]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_data_workers_outlive_sigterm_and_sigint_sent_to_them() -> None:
    """Catches data workers that die of a stop signal meant for their rank (torch's worker
    handler dies of a SIGTERM its parent did not send; SIGINT ends its loop): the next
    batch would fail with "a data worker process died". Also catches a rank that keeps the
    stop signals blocked after starting its workers (its main thread would take them late)."""
    dataset = AugmentingDataset(_corpus(), True, None)
    expected = [b["x"] for b in _batches(_loader(dataset, workers=0), 6)]
    loader = _loader(dataset, workers=2)
    try:
        got = [loader.next_batch()["x"]]
        assert not STOP_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
        workers = _data_workers()
        assert len(workers) == 2, workers
        for pid in workers:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
        time.sleep(0.5)
        assert all(_alive(pid) for pid in workers)
        got += [loader.next_batch()["x"] for _ in range(5)]
    finally:
        loader.close()
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert not any(_alive(pid) for pid in workers)  # close() ended them


def test_a_stop_signal_between_a_workers_fork_and_its_init_leaves_it_alive(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the rank forking its data workers with the stop signals unblocked (no
    `starting_workers` around the start): a SIGTERM that reaches a worker after its fork and
    before its `worker_init_fn` ignores it kills it, and the rank fails with "a data worker
    process died" instead of stopping. Here each worker is sent SIGTERM and SIGINT exactly
    then (by a `worker_init_fn` that signals it before calling `started`): inherited
    blocked, they stay pending until `started` ignores them, and every batch arrives."""
    from embodichain.core.data import loader as loader_module

    started = loader_module.started

    def signalled_then_started(worker_id: int) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(os.getpid(), sig)
        started(worker_id)

    monkeypatch.setattr(loader_module, "started", signalled_then_started)
    dataset = AugmentingDataset(_corpus(), True, None)
    expected = [b["x"] for b in _batches(_loader(dataset, workers=0), 4)]
    got = [b["x"] for b in _batches(_loader(dataset, workers=2), 4)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def _batches(loader: BatchLoader, n: int) -> list[dict[str, torch.Tensor]]:
    try:
        return [loader.next_batch() for _ in range(n)]
    finally:
        loader.close()


HANGING = """
import sys, time, torch
import torch.utils.data._utils as utils
from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.samplers import ReplacementSampler

utils.MP_STATUS_CHECK_INTERVAL = 0.5  # torch's join timeouts at shutdown: shorter here
loaded = 0

class Hanging:  # its first batch loads, then the worker hangs in __getitem__
    def __len__(self):
        return 64
    def __getitem__(self, index):
        global loaded
        loaded += 1
        if loaded > 8:
            time.sleep(3600)
        return {"x": torch.zeros(4)}

loader = BatchLoader(DatasetSource(Hanging(), identity="t"), ReplacementSampler(64, 8, 7, 0),
                     torch.device("cpu"), seed=7, rank=0, workers=1, prefetch=1)
loader.next_batch()
time.sleep(0.5)  # the worker is in the second batch's __getitem__ by now
print(loader._iterator._workers[0].pid, flush=True)
if sys.argv[1] == "close":
    worker = loader._iterator._workers[0]
    loader.close()
    print("closed; worker alive:", worker.is_alive(), flush=True)
"""


@pytest.mark.slow  # a fresh interpreter each, to exit through Python's own shutdown
@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_data_worker_stuck_in_getitem_still_ends_with_its_rank(how: str, tmp_path: Path
                                                                 ) -> None:
    """A worker busy in a long `__getitem__` does not answer torch's shutdown message, and
    the SIGTERM torch then sends it (as Python's own exit does to its children) is ignored.
    Catches `close()` leaving it alive (the broken variant: no SIGKILL after torch's grace)
    and an exit without `close()` that hangs forever in multiprocessing's join (no exit
    hook closing the open loaders)."""
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: the worker holds them
        proc = subprocess.Popen([sys.executable, "-c", HANGING, how], cwd=REPO,
                                env=worker_env(), stdout=stdout, stderr=stderr)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        proc.kill()
        proc.wait()
        printed = out.read_text().split()
        worker = int(printed[0]) if printed else None
        deadline = time.monotonic() + 5
        while worker is not None and _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = worker is not None and _alive(worker)
        if alive:
            os.kill(worker, signal.SIGKILL)  # leave nothing behind a failed test
    if how == "close":
        assert printed[1:] == ["closed;", "worker", "alive:", "False"], (printed, err.read_text())
    assert code == 0, (code, err.read_text())  # not hung in Python's exit
    assert not alive, f"data worker {worker} outlived its rank"


def test_a_worker_killed_while_the_rank_is_elsewhere_fails_its_next_batch() -> None:
    """Catches torch's SIGCHLD verdict raised wherever the rank happens to be when a data
    worker dies (in a checkpoint's write, or in the handling of the error that the death
    already caused, whose message it then replaces: the flake in which rank 1's "a data
    worker process died" lost its "; the last snapshot is ..."): nothing is raised while the
    rank is away from the loader, and its next batch raises the death, naming the worker."""
    from embodichain.core.errors import DataFailure

    loader = _loader(AugmentingDataset(_corpus(), True, None), workers=2)
    try:
        loader.next_batch()
        victim = _data_workers()[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _alive(victim):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(50):  # the SIGCHLD handler runs in here: it must not raise
            time.sleep(0.01)
        with pytest.raises(DataFailure) as failure:
            loader.next_batch()
    finally:
        loader.close()
    assert str(failure.value) == (f"a data worker process died (rank 0, update 2): DataLoader "
                                  f"worker (pid {victim}) is killed by signal: Killed.")
