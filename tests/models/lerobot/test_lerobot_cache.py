"""The node-local table cache (R-SCALE-1): built once, reused, rebuilt for a changed dataset,
no 2 GiB limit on an image column, and a cache directory that cannot be written still reads."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from embodichain_models.data.lerobot import LeRobotFrames
from embodichain_models.data.lerobot import tables as tables_module

from tests.models.lerobot.helpers import noise_images

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


def test_a_cache_directory_that_cannot_be_written_still_reads(
        small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a reader that needs a writable cache (a read-only home on a cluster stopped
    the run): under a cache path that cannot be created, the examples are the same, and
    nothing is left in the temporary directory."""
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    expected = _examples(small)
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    assert _same(_examples(small), expected)
    assert list((tmp_path / "tmp").iterdir()) == []
