"""The node-local cache of a LeRobot selection's table columns, built once per node.

One entry per selection of episodes (`<cache_dir()>/lerobot/<key>/`), under a key made of
every data file's digest-cache key (real path, size, mtime, inode, parquet footer: see
`embodichain.core.data.digests.cache_key`) and of where each selected episode's rows are,
so that a changed dataset is never taken for the old one. It holds one file per column a
source has asked for (columns are added as other selections of features need them): a
numeric column as a `.npy` array, an image column as its encoded bytes back to back
(`.bytes`) and an int64 `[rows, 2]` array of each row's (start, end) in them
(`.spans.npy`), so no column has a 2 GiB limit. The first process on the node builds what
is missing while the others wait on the entry's lock (`fcntl.flock`, not a collective),
then every process maps the files read-only: every rank and forked data worker shares one
copy through the page cache, and a restart maps them again without reading a table.

Nothing is written beside the data. A cache directory that cannot be written costs a
private build in a temporary directory, removed as soon as it is mapped (one warning).
When an entry is built, the entries whose data files have since changed or gone are
removed, so the cache holds at most one copy of each selection of an existing dataset.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embodichain.core.data.digests import cache_dir, cache_key

_VERSION = 1
MANIFEST = "manifest.json"


def entry_key(file_keys: list[str], layout: list[Any]) -> str:
    """The key of a selection: its data files' cache keys and its episodes' `layout`."""
    stamp = {"v": _VERSION, "files": file_keys, "layout": layout}
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()


def column_file(folder: Path, key: str, suffix: str) -> Path:
    """The file of column `key` (any feature name made safe for a file name)."""
    safe = "".join(c if c.isalnum() or c in "._-" else f"%{ord(c):02x}" for c in key)
    return folder / f"{safe}{suffix}"


@contextlib.contextmanager
def locked_entry(files: list[Path], layout: list[Any]) -> Iterator[tuple[Path, bool]]:
    """`(folder, shared)`: the entry's folder, held under its lock until the block ends
    (build what is missing there, then map it). `shared` is False where the cache cannot
    be written: the folder is then a private temporary one, removed after the block (the
    maps made in it stay valid)."""
    file_keys = [cache_key(p) for p in files]
    key = entry_key(file_keys, layout)
    root = cache_dir() / "lerobot"
    folder = root / key
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = os.open(root / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        _warn(f"the table cache {root} cannot be written ({exc.strerror}): each process "
              "copies the tables it reads into a temporary directory (set "
              "EMBODICHAIN_CACHE_DIR to a writable directory)")
        private = Path(tempfile.mkdtemp(prefix="embodichain-lerobot-"))
        try:
            yield private, False
        finally:
            shutil.rmtree(private, ignore_errors=True)
        return
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others on this node wait, then map it
        manifest = folder / MANIFEST
        if not manifest.is_file():
            prune(root, keep=key)
            write_atomic(manifest, json.dumps(
                {"files": [os.path.realpath(p) for p in files],
                 "keys": file_keys}).encode())
        yield folder, True
    finally:
        os.close(lock)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place (whole or absent)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def prune(root: Path, keep: str) -> None:
    """Remove the entries whose data files changed or are gone (not one another process
    holds: its lock is tried, never waited for)."""
    for manifest in root.glob(f"*/{MANIFEST}"):
        folder = manifest.parent
        if folder.name == keep or not _stale(manifest):
            continue
        try:
            lock = os.open(root / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)  # maps of its files stay valid
            (root / f"{folder.name}.lock").unlink(missing_ok=True)
        finally:
            os.close(lock)


def _stale(manifest: Path) -> bool:
    try:
        record = json.loads(manifest.read_text())
        return any(cache_key(Path(p)) != k
                   for p, k in zip(record["files"], record["keys"], strict=True))
    except (OSError, ValueError, KeyError, TypeError):
        return True


def _warn(message: str, _warned: set[str] = set()) -> None:  # noqa: B006 (once per process)
    if not _warned:
        _warned.add(message)
        logging.getLogger("embodichain").warning("warning: %s", message)
