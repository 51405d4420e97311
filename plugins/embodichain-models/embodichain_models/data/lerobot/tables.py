"""The parquet rows of the selected episodes, memory-mapped from the node-local cache.

Each selected column is copied once per node from the parquet files into the cache
(`node_cache`), in the order of the selected episodes, each episode checked against its
metadata (count and global `index`) while it is copied; then every process maps it
read-only. Numeric columns are `[rows]` or `[rows, n]` arrays; an image column gives each
row's encoded bytes (PNG) on request (`ImageBytes`), read from the map: nothing is decoded
whole into a process's heap, so a process's memory does not grow with the dataset (R-SCALE-1)
and the DataLoader's forked workers share the same pages (R-DATA-6). Examples never use
pyarrow, so no pyarrow thread pool runs in a forked worker. The copy is read row group by
row group (memory bounded by a file's numeric columns and one batch of images).
"""

from __future__ import annotations

import errno
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodichain_models.data.lerobot.errors import CacheSpaceError, LeRobotFormatError
from embodichain_models.data.lerobot.metadata import Episode, LeRobotMeta, parquet_columns
from embodichain_models.data.lerobot.node_cache import (
    column_file,
    locked_entry,
    space_refusal,
    temporary,
)

_BATCH_ROWS = 64  # image rows read at a time while the cache is built
_NPY, _BYTES, _SPANS = ".npy", ".bytes", ".spans.npy"


class ImageBytes:
    """An image column: `images[row]` is that row's encoded bytes (64-bit offsets)."""

    def __init__(self, data: np.ndarray, spans: np.ndarray) -> None:
        self.data, self.spans = data, spans

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, row: int) -> bytes:
        start, end = self.spans[row]
        return self.data[int(start):int(end)].tobytes()


@dataclass
class Tables:
    """Rows of the selected episodes: `columns[key][row]` (mapped arrays),
    `images[key][row]` (PNG bytes)."""

    columns: dict[str, np.ndarray]
    images: dict[str, ImageBytes]
    data_files: list[Path]
    in_use: object | None = None  # keeps the cache entry from being removed while mapped

    def __len__(self) -> int:
        return len(self.columns["index"])


def read_tables(meta: LeRobotMeta, episodes: list[Episode], keys: list[str] | None = None
                ) -> Tables:
    """The rows of `episodes` (in that order), mapped from the node-local cache (built
    there first if missing); of the features, only those in `keys` (default all), so an
    unselected camera's image bytes are never read."""
    by_file: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_file[episode.data_file].append(episode)
    files = [meta.root / name for name in by_file]
    for path in files:
        if not path.is_file():
            raise LeRobotFormatError(f"{path} is missing")
    selected = meta.column_keys if keys is None else [k for k in meta.column_keys if k in keys]
    wanted = list(dict.fromkeys([*selected, "timestamp", "frame_index",
                                 "episode_index", "index", "task_index"]))
    images = [k for k in wanted if k in meta.image_keys]
    layout = [[e.index, e.start, e.length, e.data_file] for e in episodes]
    with locked_entry(files, layout) as entry:
        folder = entry.folder
        missing = [k for k in wanted if not column_file(
            folder, k, _BYTES if k in images else _NPY).is_file()]
        if missing:
            import pyarrow as pa

            needed = copy_size(meta, by_file, missing, images)
            entry.make_room(needed)
            # The system allocator returns a row group's large buffers to the OS when they
            # are freed; the default (jemalloc/mimalloc) keeps them for this process's life.
            pool = pa.default_memory_pool()
            pa.set_memory_pool(pa.system_memory_pool())
            try:
                _build(meta, episodes, by_file, missing, images, folder)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise CacheSpaceError(space_refusal(folder, needed, None)) from None
            finally:
                pa.set_memory_pool(pool)
        return Tables(columns={k: _map(column_file(folder, k, _NPY))
                               for k in wanted if k not in images},
                      images={k: ImageBytes(_map_bytes(column_file(folder, k, _BYTES)),
                                            _map(column_file(folder, k, _SPANS)))
                              for k in images},
                      data_files=files, in_use=entry.in_use)


def copy_size(meta: LeRobotMeta, by_file: dict[str, list[Episode]], keys: list[str],
              images: list[str]) -> int:
    """About the bytes the cache takes for `keys` of the selected rows: each column's
    uncompressed size in the parquet footers, in proportion to the rows selected from each
    file, plus the image spans (16 bytes a row)."""
    import pyarrow.parquet as pq

    total = 0
    for name, members in by_file.items():
        path = meta.root / name
        footer = _guard(path, lambda p=path: pq.ParquetFile(p).metadata)
        if not footer.num_rows:
            continue
        share = sum(e.length for e in members) / footer.num_rows
        for group in range(footer.num_row_groups):
            row_group = footer.row_group(group)
            for j in range(row_group.num_columns):
                column = row_group.column(j)
                top = column.path_in_schema
                if any(top == k or top.startswith(f"{k}.") for k in keys):
                    total += int(column.total_uncompressed_size * share)
    rows = sum(e.length for members in by_file.values() for e in members)
    return total + 16 * rows * sum(k in images for k in keys)


def _map(path: Path) -> np.ndarray:
    # Copy-on-write: reading costs no private memory, and the arrays stay writable for
    # torch.from_numpy (a write would go to a private page, never to the cache).
    return np.asarray(np.load(path, mmap_mode="c"))


def _map_bytes(path: Path) -> np.ndarray:
    if path.stat().st_size == 0:  # mmap refuses an empty file
        return np.zeros(0, np.uint8)
    return np.asarray(np.memmap(path, np.uint8, mode="r"))  # only ever copied out of


def _build(meta: LeRobotMeta, episodes: list[Episode], by_file: dict[str, list[Episode]],
           keys: list[str], images: list[str], folder: Path) -> None:
    """Write `keys`' columns of the selected rows into `folder`, each file whole or absent;
    the bookkeeping columns are read (and the rows checked) whatever `keys` is."""
    import pyarrow.parquet as pq

    position, at = {}, 0
    for episode in episodes:
        position[episode.index], at = at, at + episode.length
    numeric = [k for k in keys if k not in images]
    read = list(dict.fromkeys([*numeric, "episode_index", "index"]))
    arrays: dict[str, np.ndarray] = {}
    writers = {k: _ImageWriter(folder, k, at) for k in keys if k in images}
    try:
        for name, members in by_file.items():
            path = meta.root / name
            present = set(parquet_columns(path))  # the footer: the rows are read below
            absent = [k for k in keys if k not in present]
            if absent:
                raise LeRobotFormatError(f"{path}: no column {absent[0]!r} (meta/info.json "
                                         "lists it as a feature)")
            parquet = _guard(path, lambda p=path: pq.ParquetFile(p, memory_map=True))
            table = _guard(path, lambda f=parquet: f.read(columns=read, use_threads=False))
            of_row = _as_numpy(table.column("episode_index"), path, "episode_index")
            index = _as_numpy(table.column("index"), path, "index")
            destination = np.full(len(of_row), -1, dtype=np.int64)
            for episode in members:
                rows = np.flatnonzero(of_row == episode.index)
                _check(path, episode, rows, index)
                destination[rows] = position[episode.index] + np.arange(episode.length)
            chosen = destination >= 0
            for key in numeric:
                values = _as_numpy(table.column(key), path, key)
                if key not in arrays:
                    target = temporary(column_file(folder, key, _NPY))
                    arrays[key] = np.lib.format.open_memmap(
                        target, mode="w+", dtype=values.dtype, shape=(at, *values.shape[1:]))
                    _reserve(target)
                arrays[key][destination[chosen]] = values[chosen]
            del table
            for writer in writers.values():
                writer.add(path, parquet, destination)
        for key, array in arrays.items():
            array.flush()
            os.replace(temporary(column_file(folder, key, _NPY)), column_file(folder, key, _NPY))
        for writer in writers.values():
            writer.finish()
    finally:
        for key in arrays:
            temporary(column_file(folder, key, _NPY)).unlink(missing_ok=True)
        for writer in writers.values():
            writer.discard()


def _reserve(path: Path) -> None:
    """Allocate a memory-mapped file's blocks now: a full disk is then an OSError (ENOSPC)
    here, not a SIGBUS at the first write to a page the disk has no room for."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # the file system cannot
            raise
    finally:
        os.close(fd)


def _check(path: Path, episode: Episode, rows: np.ndarray, index: np.ndarray) -> None:
    if len(rows) != episode.length:
        raise LeRobotFormatError(
            f"{path} holds {len(rows)} rows of episode {episode.index}, but its "
            f"metadata says {episode.length}")
    found = index[rows]
    if not np.array_equal(found, np.arange(episode.start, episode.start + episode.length)):
        raise LeRobotFormatError(
            f"{path}: the rows of episode {episode.index} have index "
            f"{found[0]}..{found[-1]} (not in order from {episode.start})")


class _ImageWriter:
    """Copies one image column's selected rows into `<key>.bytes`, recording each row's
    (start, end) in `<key>.spans.npy` (int64: no 2 GiB limit)."""

    def __init__(self, folder: Path, key: str, rows: int) -> None:
        self.key = key
        self.paths = column_file(folder, key, _BYTES), column_file(folder, key, _SPANS)
        self.out = temporary(self.paths[0]).open("wb")
        self.spans = np.zeros((rows, 2), dtype=np.int64)
        self.at = 0

    def add(self, path: Path, parquet: Any, destination: np.ndarray) -> None:
        first = 0
        for batch in _batches(path, parquet, self.key):
            column = _binary(batch.column(0), path, self.key)
            where = destination[first:first + len(column)]
            first += len(column)
            if not (where >= 0).any():
                continue
            offsets, data = _buffers(column)
            valid = (np.ones(len(column), bool) if not column.null_count else
                     column.is_valid().to_numpy(zero_copy_only=False))
            for row in np.flatnonzero(where >= 0):
                start, end = int(offsets[row]), int(offsets[row + 1])
                if valid[row]:
                    self.out.write(data[start:end])
                else:  # a missing image: no bytes (refused when decoded)
                    start = end
                self.spans[where[row]] = (self.at, self.at + end - start)
                self.at += end - start

    def finish(self) -> None:
        self.out.close()
        with temporary(self.paths[1]).open("wb") as f:
            np.save(f, self.spans)
        os.replace(temporary(self.paths[1]), self.paths[1])
        os.replace(temporary(self.paths[0]), self.paths[0])  # last: marks the column done

    def discard(self) -> None:
        self.out.close()
        for path in self.paths:
            temporary(path).unlink(missing_ok=True)


def _batches(path: Path, parquet: Any, key: str) -> Any:
    """One column's record batches of `_BATCH_ROWS` rows, read one at a time (a damaged
    file: a LeRobotFormatError naming it)."""
    import pyarrow as pa

    try:
        yield from parquet.iter_batches(batch_size=_BATCH_ROWS, columns=[key],
                                        use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable parquet file ({exc})") from None


def _guard(path: Path, read: Any) -> Any:
    import pyarrow as pa

    try:
        return read()
    except (pa.ArrowException, OSError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable parquet file ({exc})") from None


def _binary(column: Any, path: Path, key: str) -> Any:
    import pyarrow as pa

    if pa.types.is_struct(column.type):  # the Hugging Face Image feature: {bytes, path}
        column = column.flatten()[column.type.get_field_index("bytes")]
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise LeRobotFormatError(f"{path}: image column {key!r} holds {column.type}, not "
                                 "encoded image bytes")
    return column


def _buffers(column: Any) -> tuple[np.ndarray, memoryview]:
    """A binary column's offsets (`rows + 1`, 32 or 64 bit) and its data, without a copy."""
    import pyarrow as pa

    _, offsets, data = column.buffers()
    kind = np.int64 if pa.types.is_large_binary(column.type) else np.int32
    offsets = np.frombuffer(offsets, dtype=kind)[column.offset:column.offset + len(column) + 1]
    return offsets, memoryview(data) if data is not None else memoryview(b"")


def _as_numpy(column: Any, path: Path, key: str) -> np.ndarray:
    """A scalar column as `[rows]`, a (fixed-size) list column as `[rows, n]`."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or \
            pa.types.is_large_list(column.type):
        rows = len(column)
        values = column.flatten()
        if rows and len(values) % rows:
            raise LeRobotFormatError(f"{path}: column {key!r} has rows of unequal length")
        return np.ascontiguousarray(values.to_numpy(zero_copy_only=False).reshape(rows, -1))
    return np.ascontiguousarray(column.to_numpy(zero_copy_only=False))
