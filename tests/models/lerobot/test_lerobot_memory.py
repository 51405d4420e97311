"""A LeRobot source's memory does not grow with the dataset (R-SCALE-1): 2 ranks × 2 forked
data workers read a ~150 MB image dataset, and no process's anonymous memory (heap and
copies, not the page-cache pages of the node-local cache it maps) grows by more than a
quarter of the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.models.lerobot.helpers import noise_images
from tests.support.processes import assert_ok, run_torchrun, worker_env


@pytest.fixture(scope="session")
def noise_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~150 MB of PNG rows (200 frames of 512 px noise, 10 per parquet file). A copying
    reader grows by a multiple of the data at any size; what a right reader holds (decode
    buffers, what the cache build keeps) does not grow with it: ~0.66x the limit here
    (8 files of 40 frames, 250 MB: ~0.81x)."""
    return noise_images(tmp_path_factory.mktemp("noise") / "data", episodes=20, frames=10)


def _size(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "data").rglob("*.parquet"))


@pytest.mark.slow
def test_two_ranks_and_their_workers_read_without_copying_the_data(
        noise_dataset: Path, tmp_path: Path) -> None:
    """Catches a reader that decodes the tables into each process's heap (as before: 3.3×
    the data per rank, copied again into every worker's page tables), or whose workers
    copy the image bytes: each rank and each of its workers grows by at most 0.25× the data
    in anonymous memory, every example read once across the ranks. Each process may hold
    at most 2× the data beyond its start (RLIMIT_DATA), so a copying reader fails fast.
    glibc's mmap threshold is fixed: left dynamic, it keeps up to ~60 MB of each worker's
    freed decode buffers (3 MB float frames) in the heap, whatever the data's size."""
    data = _size(noise_dataset)
    assert data > 140 << 20
    proc = run_torchrun(str(noise_dataset), str(tmp_path), str(2 * data), nproc=2,
                        module="tests.models.lerobot.memory_probe", timeout=240,
                        env=worker_env(EMBODICHAIN_CACHE_DIR=str(tmp_path / "cache"),
                                       MALLOC_MMAP_THRESHOLD_="131072"))
    assert_ok(proc)
    examples = []
    for rank in range(2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        examples += record["examples"]
        assert len(record["workers"]) == 2
        grown = {"opened": record["opened"] - record["before"],
                 "after": record["after"] - record["before"],
                 **{f"worker {pid}": kib - record["before"]
                    for pid, kib in record["workers"].items()}}
        assert max(grown.values()) * 1024 <= data // 4, (rank, grown, data)
    assert sorted(examples) == list(range(200))
