"""The node-local cache of a LeRobot selection's table columns, built once per node.

One entry per selection of episodes (`<cache_dir()>/lerobot/<key>/`), under a key made of
every data file's digest-cache key (real path, size, mtime, inode, parquet footer: see
`embodichain.core.data.digests.cache_key`) and of where each selected episode's rows are,
so that a changed dataset is never taken for the old one, nor one selection for another.
It holds one file per column a source has asked for (columns are added as other selections
of features need them): a numeric column as a `.npy` array, an image column as its encoded
bytes back to back (`.bytes`) and an int64 `[rows, 2]` array of each row's (start, end) in
them (`.spans.npy`), so no column has a 2 GiB limit. The first process on the node builds
what is missing while the others wait on the entry's lock (`NodeLock`, not a collective),
then every process maps the files read-only: every rank and forked data worker shares one
copy through the page cache, and a restart maps them again without reading a table.

Faults: the files of a build killed mid-way (`.<file>.<pid>.tmp`) are removed at the next
start, under the lock, once their process is gone. Before copying, the free space is
checked against the copy's size (from the parquet footers), so a full disk is a refusal
(`CacheSpaceError`) rather than a SIGBUS in a memory map. Entries whose data files changed
or are gone are removed, and the cache's total size is bounded
(`EMBODICHAIN_LEROBOT_CACHE_LIMIT`, default 200 GiB) by removing the least recently used
entries; an entry some process has mapped (a shared lock on `<key>.use`) is never removed.

Nothing is written beside the data. Where the cache directory cannot be written, the node
shares a per-user fallback, `<tempdir>/embodichain-<uid>/lerobot` (same locks, one copy per
node, one warning); only where that fails too does each process build a private copy in a
temporary directory, removed as soon as it is mapped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from embodichain.core.data.digests import cache_dir, cache_key
from embodichain.core.data.node_lock import NodeLock
from embodichain.core.errors import UsageError
from embodichain.core.recipe.machine_limits import readable_size
from embodichain_models.data.lerobot.errors import CacheSpaceError

_VERSION = 1
MANIFEST = "manifest.json"
LIMIT_VARIABLE = "EMBODICHAIN_LEROBOT_CACHE_LIMIT"
DEFAULT_LIMIT = 200 << 30
FREE_MARGIN = 256 << 20  # left free on the disk beyond a copy's size (metadata, others)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_LEFTOVER = re.compile(r"^\..+\.(\d+)\.tmp$")


def entry_key(file_keys: list[str], layout: list[Any]) -> str:
    """The key of a selection: its data files' cache keys and its episodes' `layout`."""
    stamp = {"v": _VERSION, "files": file_keys, "layout": layout}
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()


def column_file(folder: Path, key: str, suffix: str) -> Path:
    """The file of column `key` (any feature name made safe for a file name)."""
    safe = "".join(c if c.isalnum() or c in "._-" else f"%{ord(c):02x}" for c in key)
    return folder / f"{safe}{suffix}"


class Entry:
    """A selection's folder, held under its lock by `locked_entry`. `root` is the cache's
    `lerobot/` folder, None for a private temporary folder (nothing shared, nothing kept).
    `in_use` is kept by whatever maps the folder's files: while it lives, no other process
    removes the entry."""

    def __init__(self, folder: Path, root: Path | None, in_use: object | None) -> None:
        self.folder, self.root, self.in_use = folder, root, in_use

    @property
    def shared(self) -> bool:
        return self.root is not None

    def make_room(self, needed: int) -> None:
        """Before `needed` bytes are copied here: remove the entries of changed data and the
        least recently used ones beyond the cache's limit, then refuse (`CacheSpaceError`)
        when the disk still lacks `needed` bytes and a margin."""
        if self.root is not None:
            prune(self.root, keep=self.folder.name, incoming=needed)
        free = shutil.disk_usage(self.folder).free
        if free < needed + FREE_MARGIN:
            raise CacheSpaceError(space_refusal(self.folder, needed, free))


def space_refusal(folder: Path, needed: int, free: int | None) -> str:
    """The refusal for a cache folder without room for `needed` bytes."""
    has = "" if free is None else f", and its disk has {readable_size(free)} free"
    return (f"the LeRobot table cache {folder.parent} needs {readable_size(needed)} "
            f"({needed} bytes, plus {readable_size(FREE_MARGIN)} kept free) for this "
            f"selection's columns{has}: point the cache at a disk with room with "
            "EMBODICHAIN_CACHE_DIR=/a/larger/local/disk (the tables go to its lerobot/ "
            "folder), free space there, or select fewer features (features=[...]: the "
            "cameras not selected are not copied)")


@contextlib.contextmanager
def locked_entry(files: list[Path], layout: list[Any]) -> Iterator[Entry]:
    """The selection's `Entry`, held under its lock until the block ends (build what is
    missing there, then map it). Under the cache directory, else the per-user fallback of
    this node, else (neither writable) a private temporary folder removed after the block
    (the maps made in it stay valid)."""
    file_keys = [cache_key(p) for p in files]
    key = entry_key(file_keys, layout)
    failed: list[str] = []
    for root in (cache_dir() / "lerobot", None):
        try:
            root = root if root is not None else fallback_root()
            (root / key).mkdir(parents=True, exist_ok=True)
            lock = NodeLock(root / f"{key}.lock")
        except OSError as exc:
            failed.append(f"{root or 'the per-user fallback'}: {exc.strerror or exc}")
            continue
        if failed:
            _warn(f"the table cache cannot be written ({failed[0]}): the tables are cached "
                  f"in {root} for this node instead (set EMBODICHAIN_CACHE_DIR to a writable "
                  "directory)")
        with lock:  # the others on this node wait, then map it
            folder = root / key
            remove_leftovers(folder)
            manifest = folder / MANIFEST
            if manifest.is_file():
                os.utime(manifest)  # the entry's last use, for the size bound
            else:
                write_atomic(manifest, json.dumps(
                    {"files": [os.path.realpath(p) for p in files],
                     "keys": file_keys}).encode())
            yield Entry(folder, root, hold_in_use(root / f"{key}.use"))
        return
    _warn(f"the table cache cannot be written ({'; '.join(failed)}): each process copies "
          "the tables it reads into a temporary directory (set EMBODICHAIN_CACHE_DIR to a "
          "writable directory)")
    private = Path(tempfile.mkdtemp(prefix="embodichain-lerobot-"))
    try:
        yield Entry(private, None, None)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def fallback_root() -> Path:
    """`<tempdir>/embodichain-<uid>/lerobot`: this user's, shared by the processes of the
    node. Refused (OSError) unless the folder is a directory of this user's that no one
    else may write (a shared /tmp: never follow another user's folder or link)."""
    base = Path(tempfile.gettempdir()) / f"embodichain-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    info = os.lstat(base)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise OSError(errno.EPERM, f"{base} is not a private directory of this user's")
    return base / "lerobot"


class InUse:
    """A shared lock on an entry's `<key>.use` file, held for as long as this object lives
    (and in the forked processes that inherit it): `prune` leaves the entry alone
    meanwhile. Pickled (for a spawned data worker) as None: the parent holds it."""

    def __init__(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_SH)
        weakref.finalize(self, os.close, fd)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return type(None), ()


def hold_in_use(path: Path) -> InUse | None:
    """An `InUse` on `path`, or None where the file cannot be opened."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    return InUse(fd)


def remove_leftovers(folder: Path) -> None:
    """Remove the temporary files of builds whose process is gone (killed mid-way). Called
    under the entry's lock, so no live build of another process is writing here."""
    for path in folder.iterdir():
        found = _LEFTOVER.match(path.name)
        if found and not _alive(int(found.group(1))):
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_atomic(path: Path, data: bytes) -> None:
    tmp = temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def temporary(path: Path) -> Path:
    """Where `path` is written before it is renamed into place (whole or absent)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def cache_limit() -> int:
    """The bound on the cache's total size: `EMBODICHAIN_LEROBOT_CACHE_LIMIT` (bytes, or
    with a K, M, G or T suffix, powers of 1024), default 200 GiB."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_LIMIT
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?", text, re.IGNORECASE)
    if found is None:
        raise UsageError(f"{LIMIT_VARIABLE}={text!r} is not a size (e.g. 500G, 2T or bytes)")
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])


def prune(root: Path, keep: str, incoming: int = 0) -> None:
    """Remove the entries whose data files changed or are gone, then the least recently
    used ones while the cache with `incoming` more bytes exceeds `cache_limit()`; never
    `keep`, nor an entry a process holds (its locks are tried, never waited for)."""
    entries = []
    for manifest in root.glob(f"*/{MANIFEST}"):
        folder = manifest.parent
        if folder.name != keep:
            with contextlib.suppress(OSError):
                entries.append((manifest.stat().st_mtime_ns, folder, _size(folder)))
    total = _size(root / keep) + incoming + sum(size for _, _, size in entries)
    limit = cache_limit()
    for _, folder, size in sorted(entries, key=lambda e: e[0]):
        if (total > limit or _stale(folder / MANIFEST)) and _remove(root, folder.name):
            total -= size


def _remove(root: Path, name: str) -> bool:
    """Remove entry `name` unless a process is building it or has it mapped."""
    with contextlib.ExitStack() as held:
        for suffix in (".lock", ".use"):
            try:
                lock = NodeLock(root / f"{name}{suffix}", wait=False)
            except OSError:
                return False
            if not held.enter_context(lock):
                return False
        shutil.rmtree(root / name, ignore_errors=True)  # maps of its files stay valid
        for suffix in (".lock", ".use"):
            (root / f"{name}{suffix}").unlink(missing_ok=True)
        return True
    return False  # pragma: no cover (the block returns)


def _size(folder: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
    return total


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
