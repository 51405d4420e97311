"""Content digests of data files, computed once per machine and cached outside the data.

Nothing is ever written beside a data file (datasets sit on read-only shared mounts). The
digest of a file is kept in a per-user cache directory (`cache_dir()`), under a key made of
the file's real path, size, modification time (ns) and inode, and for a parquet table also
a hash of its footer (the last 64 KiB or the whole footer if larger), so that a replaced
file is never taken for the old one. The first process on a machine to ask hashes the file
while every other one waits on a per-key file lock (`NodeLock`, not a collective: hashing
a terabyte must not run into a process group's timeouts), then reads the cached result;
after a restart the digest comes from the cache. A cache that cannot be written is not
kept: the file is hashed without it, with one warning per process. `computed_once` does the
same for any per-file result (the LeRobot reader's video checks). No torch here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from embodichain.core.data.node_lock import NodeLock
from embodichain.core.file_hash import file_sha256

FOOTER_BYTES = 64 << 10  # at least this much of a parquet file's tail goes into the key
_MAX_FOOTER = 64 << 20
_KEY_VERSION = 1
_warned: set[str] = set()


def cache_dir() -> Path:
    """`$EMBODICHAIN_CACHE_DIR`, else `$XDG_CACHE_HOME/embodichain`, else
    `~/.cache/embodichain`."""
    if os.environ.get("EMBODICHAIN_CACHE_DIR"):
        return Path(os.environ["EMBODICHAIN_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "embodichain"


def parquet_footer(path: Path, size: int) -> bytes:
    """The tail of a parquet file holding its footer (row groups, statistics, schema)."""
    with path.open("rb") as f:
        tail = min(size, FOOTER_BYTES)
        f.seek(size - tail)
        data = f.read(tail)
        if len(data) >= 8 and data[-4:] == b"PAR1":
            needed = int.from_bytes(data[-8:-4], "little") + 8
            if tail < needed <= min(size, _MAX_FOOTER):
                f.seek(size - needed)
                data = f.read(needed)
    return data


def cache_key(path: Path) -> str:
    """The key under which `path`'s digest is cached: it changes when the file is replaced
    (another inode), resized, touched, or (a table) its footer differs."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    stamp: dict[str, object] = {"v": _KEY_VERSION, "path": real, "size": stat.st_size,
                                "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}
    if real.endswith(".parquet"):
        stamp["footer"] = hashlib.sha256(parquet_footer(Path(real), stat.st_size)).hexdigest()
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()


def file_digest(path: str | Path, *, cache: bool = True) -> str:
    """`sha256:<hex>` of the file's bytes, hashed at most once per machine (see the module
    docstring); `cache=False` hashes it now, reading and writing no cache."""
    path = Path(path)
    if not cache:
        return f"sha256:{file_sha256(path)}"
    key = cache_key(path)
    record = computed_once("digests", key,
                           lambda: {"sha256": file_sha256(path), "path": os.path.realpath(path)},
                           valid=_is_digest, unchanged=lambda: cache_key(path) == key)
    return f"sha256:{record['sha256']}"


def computed_once(kind: str, key: str, compute: Callable[[], dict[str, Any]], *,
                  valid: Callable[[Any], bool] = lambda record: isinstance(record, dict),
                  unchanged: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """`compute()`'s record (a JSON object) for `key`, computed at most once per machine:
    kept in `cache_dir()/kind/`, the first process computes it while the others wait on a
    per-key `flock`, then read it (after a restart too). A record is kept only when
    `unchanged()` still holds after computing (the file did not change meanwhile). A cache
    that cannot be written means computing here, with one warning per process."""
    folder = cache_dir() / kind / key[:2]
    entry = folder / f"{key}.json"
    if (hit := _read(entry, valid)) is not None:
        return hit
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = NodeLock(folder / f"{key}.lock")
    except OSError as exc:
        _warn_once(f"the cache {cache_dir()} cannot be written ({exc.strerror}): data files "
                   "are hashed and checked at every start (set EMBODICHAIN_CACHE_DIR to a "
                   "writable directory)")
        return compute()
    with lock:  # the others on this machine wait, then read it
        if (hit := _read(entry, valid)) is not None:
            return hit
        record = compute()
        if unchanged():
            _write(entry, record)
        return record


def _is_digest(record: Any) -> bool:
    digest = record.get("sha256") if isinstance(record, dict) else None
    return isinstance(digest, str) and len(digest) == 64


def _read(entry: Path, valid: Callable[[Any], bool]) -> dict[str, Any] | None:
    try:
        record = json.loads(entry.read_text())
    except (OSError, ValueError):
        return None
    return record if valid(record) else None


def _write(entry: Path, record: dict[str, Any]) -> None:
    tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, entry)  # whole or absent, never half-written
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        _warn_once(f"the cache {cache_dir()} cannot be written ({exc.strerror}): data files "
                   "are hashed and checked at every start")


def _warn_once(message: str) -> None:
    if not _warned:  # once per process, whatever the error
        _warned.add(message)
        logging.getLogger("embodichain").warning("warning: %s", message)
