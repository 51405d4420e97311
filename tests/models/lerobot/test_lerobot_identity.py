"""The LeRobot source's identity modes (R-SCALE-2): the default keeps the string earlier
versions computed (a run recorded before the digest cache moved resumes), the metadata mode
reads only meta/, table footers and video headers, and neither writes into the dataset."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from embodichain_models.data.lerobot import LeRobotFormatError, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.identity import source_files
from embodichain_models.data.lerobot.video import encode_video
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

from embodichain.core.data.identity_records import changed_files
from tests.support.files import file_listing

FPS = 10
LENGTHS = (4, 6, 5)
VIDEO = "observation.images.top"
TABLE = "data/chunk-000/file-001.parquet"
MP4 = f"videos/{VIDEO}/chunk-000/file-000.mp4"


def _frames(episode: int, n: int, shift: int = 0) -> np.ndarray:
    level = 40 + 25 * ((np.arange(n) + 3 * episode + shift) % 7)
    return (level[:, None, None, None] + np.zeros((1, 16, 16, 3))).astype(np.uint8)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    rng = np.random.default_rng(3)
    episodes = [EpisodeData(task="t", values={
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        VIDEO: _frames(e, n)}) for e, n in enumerate(LENGTHS)]
    features = {"observation.state": feature("float32", (3,)),
                "action": feature("float32", (2,)), VIDEO: feature("video", (16, 16, 3))}
    root = tmp_path_factory.mktemp("identity")
    return {v: write_dataset(root / v, episodes, features, FPS, version=v, episodes_per_file=2)
            for v in ("v3.0", "v2.1")}


def _identity_before_the_cache_moved(dataset: LeRobotFrames) -> str:
    """The identity exactly as computed before this change (embodichain 0.x, digests kept
    beside the files): kept verbatim so that the default can never drift from it."""
    def file_digest(path: Path) -> str:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        return f"sha256:{h.hexdigest()}"

    files = [(str(p.relative_to(dataset.root)), file_digest(p)) for p in source_files(dataset)]
    options = {
        "episodes": [e.index for e in dataset.episodes],
        "delta_timestamps": dataset.delta_timestamps,
        "normalize": {k: mode for k, (mode, _, _) in dataset.normalize.items()},
        "tolerance_s": dataset.tolerance_s}
    text = json.dumps({"files": files, "options": options}, sort_keys=True)
    return (f"lerobot-{dataset.meta.version}:{len(dataset.episodes)} episodes:sha256="
            f"{hashlib.sha256(text.encode()).hexdigest()}")


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_the_default_identity_is_the_string_recorded_before_and_writes_nothing(
        version: str, written: dict[str, Path], digest_cache: Path) -> None:
    """Catches an upgrade that blocks a resume (the default identity's text, options or
    file digests computed differently from before, e.g. the mode named in the hashed text),
    and a digest cached inside the dataset: the dataset's listing, with mtimes, is
    unchanged and the digests sit in the user cache."""
    root = written[version]
    before = file_listing(root)
    options = {"delta_timestamps": {"action": [0.0, 0.1]}, "normalize": {"action": "mean_std"},
               "episodes": [0, 2]}
    for opts in ({}, options):
        expected = _identity_before_the_cache_moved(LeRobotFrames(root, **opts))
        assert lerobot_source(root, **opts).identity == expected
        assert lerobot_source(root, identity="content", **opts).identity == expected  # cached
    assert file_listing(root) == before
    assert list((digest_cache / "digests").rglob("*.json"))


def test_the_metadata_identity_sees_headers_and_sizes_not_frame_bytes(
        written: dict[str, Path], tmp_path: Path, digest_cache: Path) -> None:
    """Catches a metadata mode that hashes nothing of the tables or videos (a table whose
    values' range changed, a re-encoded video of the same length must change it), that
    reads every byte after all (frame bytes overwritten in place leave it unchanged: the
    documented limit), or that compares equal to the full digest."""
    root = Path(shutil.copytree(written["v3.0"], tmp_path / "ds"))
    first = lerobot_source(root, identity="metadata").identity
    assert ":metadata-sha256=" in first and first != lerobot_source(root).identity
    assert lerobot_source(root, identity="metadata").identity == first
    assert lerobot_source(root, identity="metadata", episodes=[0, 1]).identity != first

    video = root / MP4
    stat = video.stat()
    data = bytearray(video.read_bytes())
    at = data.index(b"mdat") + 64
    data[at:at + 32] = bytes(255 - b for b in data[at:at + 32])
    with video.open("r+b") as f:  # in place, same size, mtime set back
        f.write(data)
    os.utime(video, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert lerobot_source(root, identity="metadata").identity == first

    encode_video(video, np.concatenate([_frames(e, n, shift=1)
                                        for e, n in enumerate(LENGTHS[:2])]), FPS)
    reencoded = lerobot_source(root, identity="metadata").identity
    assert reencoded != first
    table = pq.read_table(root / TABLE)
    state = np.array(table.column("observation.state").to_pylist(), np.float32)
    state[1, 0] = 100.0  # beyond the column's range: its footer statistics change
    column = pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 3)
    pq.write_table(table.set_column(table.column_names.index("observation.state"),
                                    "observation.state", column), root / TABLE)
    assert lerobot_source(root, identity="metadata").identity not in (first, reencoded)


def test_an_unknown_identity_mode_is_refused_by_name(written: dict[str, Path]) -> None:
    """Catches a misspelt mode silently taken for one of the two."""
    with pytest.raises(LeRobotFormatError, match="identity='meta'.*content, metadata"):
        lerobot_source(written["v3.0"], identity="meta")


def test_a_changed_table_is_named_between_two_identities(written: dict[str, Path],
                                                        tmp_path: Path, digest_cache: Path) -> None:
    """Catches per-file digests not recorded with an identity (a refused resume could then
    only show two opaque digests) and files named that did not change."""
    root = Path(shutil.copytree(written["v3.0"], tmp_path / "ds"))
    first = lerobot_source(root).identity
    table = pq.read_table(root / TABLE)
    pq.write_table(table.slice(0, table.num_rows), root / TABLE, compression="none")
    second = lerobot_source(root).identity
    assert second != first
    assert changed_files(first, second) == [TABLE]
