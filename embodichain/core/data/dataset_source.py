"""Map-style datasets as training sources (R-DATA-1), and content digests of data files.

A `DatasetSource` wraps any object with `__len__` and `__getitem__(i) -> dict of tensors`
(a torch `Dataset`, an HDF5 reader, a decoder of compressed frames). The trainer loads its
examples through torch's DataLoader (`trainer.data_workers`, `trainer.prefetch`; see
`data/loader.py`), fed with the sampler's indices, so the trained model does not depend on
the number of worker processes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

import torch

from embodichain.core.errors import DataFormatError


class MapDataset(Protocol):
    """What `DatasetSource` needs: a length and examples as dicts of tensors."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, Any]: ...


class DatasetSource:
    """A map-style dataset as a training source.

    `identity` names the content (a checkpoint only resumes with the same data): pass a
    digest of the files the dataset reads, e.g. `file_digest(path)`, never a path or a time.
    Workers are forked, so a dataset's in-memory arrays are shared with them, not copied;
    open file handles that cannot cross a fork (HDF5) lazily, in `__getitem__` (R-DATA-6).
    """

    def __init__(self, dataset: MapDataset, identity: str) -> None:
        if not isinstance(identity, str) or not identity:
            raise ValueError("DatasetSource needs identity=..., a digest of the data's content "
                             "(e.g. file_digest(path)), so that a changed dataset refuses a "
                             "resume")
        length = len(dataset)
        if length <= 0:
            raise DataFormatError(f"the dataset is empty (len {length})")
        self.dataset = dataset
        self.identity = identity
        self._length = length

    def __len__(self) -> int:
        return self._length

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The examples at `indices`, loaded here and stacked (the `Source` protocol).

        The trainer does not call this: it loads through the DataLoader, with each example's
        random streams seeded (R-DATA-2).
        """
        from torch.utils.data import default_collate

        return default_collate([self.dataset[int(i)] for i in indices.tolist()])


_CHUNK = 1 << 20


def file_digest(path: str | Path, *, cache: bool = True) -> str:
    """`sha256:<hex>` of the file's bytes, computed once and cached beside it.

    The cache (`<file>.sha256`, JSON) is reused only while the file's size and modification
    time are those it was computed for; otherwise the digest is computed again. A cache
    that cannot be written (read-only directory) is simply not kept.
    """
    path = Path(path)
    stat = path.stat()
    stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    side = digest_path(path)
    if cache:
        try:
            cached = json.loads(side.read_text())
            if {k: cached.get(k) for k in stamp} == stamp and str(cached.get("sha256", "")):
                return f"sha256:{cached['sha256']}"
        except (OSError, ValueError, AttributeError):
            pass
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    digest = h.hexdigest()
    if cache:
        write_digest(path, digest, stamp)
    return f"sha256:{digest}"


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def write_digest(path: Path, digest: str, stamp: dict[str, int] | None = None) -> None:
    """Record `digest` beside `path` (atomically; silently skipped when not writable)."""
    if stamp is None:
        stat = path.stat()
        stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    side = digest_path(path)
    tmp = side.with_name(f"{side.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"sha256": digest, **stamp}) + "\n")
        os.replace(tmp, side)
    except OSError:
        tmp.unlink(missing_ok=True)
