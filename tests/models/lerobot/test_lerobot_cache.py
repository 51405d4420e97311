"""The node-local table cache (R-SCALE-1, R-SCALE-2): built once per node (two processes at
once), reused, keyed by the files and the selection, rebuilt for a changed dataset, no 2 GiB
limit on an image column, a cache directory that cannot be written still read through one
per-user fallback per node; and its faults: a build killed mid-way, a full disk, the bound
on its size."""

from __future__ import annotations

import errno
import gc
import multiprocessing
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from embodichain_models.data.lerobot import LeRobotFrames, node_cache
from embodichain_models.data.lerobot import tables as tables_module
from embodichain_models.data.lerobot.errors import CacheSpaceError

from tests.models.lerobot.helpers import noise_images
from tests.support.processes import mark_then_wait_for_another, two_at_once

IMAGE = "observation.image"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 parquet files of 2 episodes × 5 frames of 16 px PNGs and a state vector."""
    return noise_images(tmp_path_factory.mktemp("small") / "data", episodes=4, frames=5,
                        size=16, per_file=2)


def _examples(root: Path) -> list[dict[str, torch.Tensor]]:
    frames = LeRobotFrames(root, delta_timestamps={IMAGE: [-0.1, 0.0]})
    return [frames[i] for i in range(len(frames))]


def _same(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(
        torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True))


def test_an_image_column_with_64_bit_offsets_gives_the_same_examples(
        small: Path, tmp_path: Path, digest_cache: Path) -> None:
    """Catches the 64-bit path read as 32-bit (a `large_binary` image column, as a table past
    2 GiB of image bytes holds, read with int32 offsets): every example of a copy whose
    image bytes have 64-bit offsets equals the original's."""
    copy = shutil.copytree(small, tmp_path / "large")
    for path in (copy / "data").rglob("*.parquet"):
        table = pq.read_table(path)
        column = table.column(IMAGE).combine_chunks()
        wide = pa.StructArray.from_arrays(
            [column.field("bytes").cast(pa.large_binary()), column.field("path")],
            names=["bytes", "path"])
        pq.write_table(table.set_column(table.column_names.index(IMAGE), IMAGE, wide), path)
        assert pa.types.is_large_binary(pq.read_schema(path).field(IMAGE).type[0].type)
    assert _same(_examples(copy), _examples(small))


def test_the_cache_is_built_once_and_again_for_a_changed_dataset(
        small: Path, tmp_path: Path, digest_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a cache rebuilt at every open (the second open must not read a table), and
    one taken for a changed dataset (a key without the files' size, time, inode, footer):
    after a data file is rewritten with other states, the examples hold the new ones."""
    root = shutil.copytree(small, tmp_path / "data")
    first = _examples(root)
    build = tables_module._build

    def refuse(*args: object) -> None:
        raise AssertionError("the cache was built again")

    monkeypatch.setattr(tables_module, "_build", refuse)
    assert _same(_examples(root), first)
    monkeypatch.setattr(tables_module, "_build", build)
    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    key = "observation.state"
    state = table.column(key).combine_chunks()
    changed = pa.FixedSizeListArray.from_arrays(
        pa.compute.add(state.flatten(), pa.scalar(1.0, pa.float32())), 4)
    pq.write_table(table.set_column(table.column_names.index(key), key, changed), path)
    again = _examples(root)
    assert torch.equal(again[0][key], first[0][key] + 1)
    assert torch.equal(again[-1][key], first[-1][key])  # the other file's rows
    assert len(list((digest_cache / "lerobot").glob("*/manifest.json"))) == 1  # old pruned


def _open_when_released(root: str, barrier, results) -> None:
    barrier.wait(timeout=30)
    frames = LeRobotFrames(root)
    results.put(frames[len(frames) - 1]["observation.state"].tolist())


def _builds_of_two_processes(root: Path, marker: Path,
                             monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two forked processes open `root` at once; the pid of each that built the cache. A
    builder waits up to 2 s for a second one to start building too (which the node lock
    prevents), so both build where nothing keeps them apart."""
    real = tables_module._build

    def marked(*args: object) -> None:
        mark_then_wait_for_another(marker)
        real(*args)
    monkeypatch.setattr(tables_module, "_build", marked)
    got = two_at_once(_open_when_released, str(root))
    monkeypatch.setattr(tables_module, "_build", real)
    frames = LeRobotFrames(root)
    assert got[0] == got[1] == frames[len(frames) - 1]["observation.state"].tolist()
    return marker.read_text().split()


def test_two_processes_opening_one_selection_build_the_cache_once(
        small: Path, tmp_path: Path, digest_cache: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a table cache built without its lock (every rank and process of a node
    copying the tables at once, each into its own temporary files): two processes open
    one selection together, one builds while the other waits, then maps its copy."""
    builders = _builds_of_two_processes(small, tmp_path / "builders", monkeypatch)
    assert len(builders) == 1, builders
    assert len(list((digest_cache / "lerobot").glob("*/manifest.json"))) == 1


def test_a_second_selection_of_the_same_files_reads_its_own_rows(
        small: Path, digest_cache: Path) -> None:
    """Catches a cache key without the episode selection: episodes [0, 1] and then [1],
    both in the first parquet file, would share one entry, and the second selection would
    read the first's rows (episode 0's states where episode 1's belong, or an IndexError).
    Each selection's examples are those of its own episodes, as the table holds them."""
    table = pq.read_table(small / "data/chunk-000/file-000.parquet")
    states = np.stack(table.column("observation.state").to_numpy(zero_copy_only=False))
    of_episode = table.column("episode_index").to_numpy()
    for episodes in ([0, 1], [1]):
        frames = LeRobotFrames(small, episodes=episodes)
        expected = states[np.isin(of_episode, episodes)]
        assert len(frames) == len(expected)
        for i in range(len(frames)):
            example = frames[i]
            assert example["episode_index"].item() in episodes
            assert np.array_equal(example["observation.state"].numpy(), expected[i])
    assert len(list((digest_cache / "lerobot").glob("*/manifest.json"))) == 2


def test_an_unwritable_cache_is_shared_by_the_node_in_a_per_user_fallback(
        small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Catches a reader that needs a writable cache (a read-only home on a cluster stopped
    the run), and one private copy per process where the cache cannot be written (each rank
    copying every table into $TMPDIR): the examples are the same, two processes build
    once, into `$TMPDIR/embodichain-<uid>/lerobot`, with one warning naming the
    directory. A fallback that is not this user's private directory is not used (another
    user could own or read it): each process then copies into a temporary directory,
    removed once mapped."""
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    expected = _examples(small)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(blocker / "cache"))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(node_cache, "_warn", lambda message: warnings.append(message))
    warnings: list[str] = []
    assert _same(_examples(small), expected)
    assert warnings and str(tmp / f"embodichain-{os.getuid()}/lerobot") in warnings[0]
    fallback = tmp / f"embodichain-{os.getuid()}"
    assert len(list((fallback / "lerobot").glob("*/manifest.json"))) == 1
    shutil.rmtree(fallback)
    builders = _builds_of_two_processes(small, tmp_path / "builders", monkeypatch)
    assert len(builders) == 1, builders
    assert [p.name for p in tmp.iterdir()] == [fallback.name]

    shutil.rmtree(fallback)
    fallback.mkdir(mode=0o777)
    fallback.chmod(0o777)  # writable by anyone: not a private directory
    assert _same(_examples(small), expected)
    assert list(fallback.iterdir()) == [] and [p.name for p in tmp.iterdir()] == [fallback.name]


def _leftovers(cache: Path) -> list[Path]:
    return [p for p in (cache / "lerobot").rglob(".*.tmp")]


def _build_and_die(root: str) -> None:
    real = tables_module._ImageWriter.add

    def add_then_die(self, *args: object) -> None:
        real(self, *args)
        self.out.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # mid-way: one file's images written
    tables_module._ImageWriter.add = add_then_die
    LeRobotFrames(root)


def test_a_build_killed_mid_way_leaves_nothing_after_the_next_start(
        small: Path, digest_cache: Path) -> None:
    """Catches the temporary files of a build killed mid-way (`.<column>.<pid>.tmp`, as
    large as the selected images) left in the cache for ever: a process SIGKILLed while it
    copies leaves them; the next start removes them (their process is gone), builds, and
    gives the right examples. A live process's temporary file is left alone."""
    child = multiprocessing.get_context("fork").Process(target=_build_and_die,
                                                        args=(str(small),))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL
    left = _leftovers(digest_cache)
    assert left and any(p.stat().st_size for p in left), left
    folder = left[0].parent
    alive = folder / f".other.bytes.{os.getpid()}.tmp"
    alive.write_bytes(b"a build of a live process")
    expected_state = pq.read_table(small / "data/chunk-000/file-000.parquet").column(
        "observation.state")[0].as_py()
    frames = LeRobotFrames(small)
    assert frames[0]["observation.state"].tolist() == pytest.approx(expected_state)
    assert _leftovers(digest_cache) == [alive]


def _free(free: int):
    return lambda path: shutil._ntuple_diskusage(1 << 40, (1 << 40) - free, free)


def test_a_cache_without_room_refuses_before_copying_naming_what_to_do(
        small: Path, digest_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a copy started on a disk without room for it (a full disk under a memory
    map ends the process with SIGBUS, no message) and one whose disk fills while it copies:
    with the free space reported as 1 MB, opening the dataset is refused (exit 2) naming
    the cache directory, the bytes needed and EMBODICHAIN_CACHE_DIR, and nothing is
    written; a disk that fills while the arrays are allocated (ENOSPC) is refused the same
    way, its temporary files removed. (The free space is faked: no disk is filled.)"""
    monkeypatch.setattr(node_cache.shutil, "disk_usage", _free(1 << 20))
    with pytest.raises(CacheSpaceError) as refused:
        LeRobotFrames(small)
    message = str(refused.value)
    assert refused.value.exit_code == 2
    assert str(digest_cache / "lerobot") in message and "EMBODICHAIN_CACHE_DIR" in message
    assert re.search(r"needs \d+\.\d [KM]B \(\d+ bytes", message), message
    assert {p.name for p in (digest_cache / "lerobot").rglob("*") if p.is_file()} <= {
        "manifest.json"} | {p.name for p in (digest_cache / "lerobot").glob("*.lock")} | {
        p.name for p in (digest_cache / "lerobot").glob("*.use")}

    monkeypatch.setattr(node_cache.shutil, "disk_usage", _free(1 << 40))

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(CacheSpaceError, match="EMBODICHAIN_CACHE_DIR"):
        LeRobotFrames(small)
    assert not _leftovers(digest_cache)
    assert not list((digest_cache / "lerobot").rglob("*.npy"))


def _entries(cache: Path) -> set[str]:
    return {p.parent.name for p in (cache / "lerobot").glob("*/manifest.json")}


def test_the_cache_is_bounded_by_removing_the_least_recently_used_unmapped_entries(
        small: Path, digest_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a cache that grows without bound across selections (each selection of each
    dataset a copy for ever), one that removes the most recent entries or one a process
    still has mapped: under EMBODICHAIN_LEROBOT_CACHE_LIMIT of about 2.5 entries, four
    selections opened in turn keep the newest, the oldest removed first, never one still
    open."""
    first = LeRobotFrames(small, episodes=[0])
    one = _entries(digest_cache)
    size = sum(p.stat().st_size for p in (digest_cache / "lerobot").rglob("*")
               if p.is_file())
    monkeypatch.setenv("EMBODICHAIN_LEROBOT_CACHE_LIMIT", str(int(2.5 * size)))
    assert node_cache.cache_limit() == int(2.5 * size)
    LeRobotFrames(small, episodes=[1])  # opened and closed: no longer mapped
    gc.collect()
    two = _entries(digest_cache) - one
    LeRobotFrames(small, episodes=[2])  # over the bound: the oldest unmapped goes
    assert len(_entries(digest_cache)) == 2 and one <= _entries(digest_cache)
    assert not two & _entries(digest_cache)  # [1], not [0]: [0] is still open
    del first
    gc.collect()
    LeRobotFrames(small, episodes=[3])
    assert not one & _entries(digest_cache) and len(_entries(digest_cache)) == 2
    monkeypatch.setenv("EMBODICHAIN_LEROBOT_CACHE_LIMIT", "1.5G")
    assert node_cache.cache_limit() == 3 << 29
    monkeypatch.delenv("EMBODICHAIN_LEROBOT_CACHE_LIMIT")
    assert node_cache.cache_limit() == node_cache.DEFAULT_LIMIT == 200 << 30
