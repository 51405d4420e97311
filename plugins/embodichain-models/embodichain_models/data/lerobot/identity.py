"""The identity of a LeRobot source, in one of two modes (`IDENTITY_MODES`).

- `"content"` (the default): a digest of every byte of every file the examples come from.
  Each file's sha256 is computed at most once per machine and cached in the per-user cache
  directory, never beside the data (`embodichain.core.data.digests`), so a changed table row
  or a replaced video changes the identity, while a start-up on an unchanged dataset only
  stats its files. The string is the one earlier versions computed (runs recorded then
  resume).
- `"metadata"`: for datasets too large to hash. It reads every byte of `meta/` and, of the
  tables and videos, only their sizes, the parquet footers (schema, row groups, column
  statistics) and the video containers' headers (every top-level mp4 box but the frame
  data: frame count, sizes and offsets of every frame). It does not see an edit that keeps
  a file's size and those headers (a value changed in place within a table's pages that
  leaves its column statistics alone, frame bytes overwritten in place in a video).

Both include the options that cut the files into examples (episodes, windows,
normalisation, tolerance). Each computed identity also records its per-file digests in the
cache (`identity_records`), so that a refused resume can name the files that changed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.errors import LeRobotFormatError

IDENTITY_MODES = ("content", "metadata")
_HEADER_LIMIT = 64 << 20  # a container header beyond this is hashed by its size only
_EDGE = 64 << 10
_MP4 = (".mp4", ".mov", ".m4v")


def source_files(dataset: LeRobotFrames) -> list[Path]:
    """The metadata files, and the data and video files of the selected episodes."""
    files = list(dataset.meta.meta_files)
    for episode in dataset.episodes:
        files.append(dataset.root / episode.data_file)
        files.extend(dataset.root / name for name, _ in episode.videos.values())
    return list(dict.fromkeys(files))


def dataset_identity(dataset: LeRobotFrames, mode: str = "content") -> str:
    """`lerobot-<version>:<n> episodes:sha256=<digest of the files' digests and the options>`
    (`mode="metadata"`: `...:metadata-sha256=...`, see the module docstring)."""
    from embodichain.learning.sl import file_digest

    if mode not in IDENTITY_MODES:
        raise LeRobotFormatError(f"identity={mode!r} is not one of {', '.join(IDENTITY_MODES)}")
    from embodichain.core.observe.work_progress import work_progress

    meta = set(dataset.meta.meta_files)
    paths = source_files(dataset)
    sizes = [p.stat().st_size if p.is_file() else 0 for p in paths]
    files = []
    # Hashing a large dataset the first time takes minutes (then the digests are cached).
    with work_progress(f"hashing {len(paths)} data files", sum(sizes), "B") as progress:
        for path, size in zip(paths, sizes, strict=True):
            files.append((str(path.relative_to(dataset.root)),
                          file_digest(path) if mode == "content" or path in meta
                          else metadata_digest(path)))
            progress.advance(size)
    options: dict[str, Any] = {
        "episodes": [e.index for e in dataset.episodes],
        "delta_timestamps": dataset.delta_timestamps,
        "normalize": {k: mode for k, (mode, _, _) in dataset.normalize.items()},
        "tolerance_s": dataset.tolerance_s}
    document: dict[str, Any] = {"files": files, "options": options}
    label = "sha256"
    if mode == "metadata":  # the default's text stays exactly what it always was
        document["identity"], label = mode, "metadata-sha256"
    text = json.dumps(document, sort_keys=True)
    identity = (f"lerobot-{dataset.meta.version}:{len(dataset.episodes)} episodes:{label}="
                f"{hashlib.sha256(text.encode()).hexdigest()}")
    record_files(identity, dataset.root, files)
    return identity


def record_files(identity: str, root: Path, files: list[tuple[str, str]]) -> None:
    from embodichain.core.data.identity_records import record_identity

    record_identity(identity, str(root), dict(files))


def metadata_digest(path: Path) -> str:
    """`meta-sha256:<hex>` of a table's or video's size and headers (no frame data, no
    table pages)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"size {size}\n".encode())
    with path.open("rb") as f:
        if path.suffix == ".parquet":
            from embodichain.core.data.digests import parquet_footer

            h.update(parquet_footer(path, size))
        elif not (path.suffix in _MP4 and _mp4_boxes(f, size, h)):
            # another container: its first and last 64 KiB
            h.update(f.read(_EDGE))
            f.seek(max(0, size - _EDGE))
            h.update(f.read(_EDGE))
    return f"meta-sha256:{h.hexdigest()}"


def _mp4_boxes(f: Any, size: int, h: Any) -> bool:
    """Hash every top-level box of an mp4 but the frame data (`mdat`: its size only);
    False where the file is not a well-formed box sequence."""
    at = 0
    while at < size:
        f.seek(at)
        head = f.read(16)
        if len(head) < 8:
            return False
        length, kind = int.from_bytes(head[:4], "big"), head[4:8]
        if length == 1 and len(head) == 16:
            length = int.from_bytes(head[8:16], "big")
        elif length == 0:
            length = size - at
        if length < 8 or at + length > size:
            return False
        h.update(kind + length.to_bytes(8, "big"))
        if kind not in (b"mdat", b"free", b"skip") and length <= _HEADER_LIMIT:
            f.seek(at)
            h.update(f.read(length))
        at += length
    return True
