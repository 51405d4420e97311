"""The parquet rows of the selected episodes, as arrays read once in the training process.

Numeric columns become contiguous NumPy arrays and image columns stay pyarrow binary
arrays (the PNG bytes): both live in buffers that the DataLoader's forked workers share
with the training process, page for page (R-DATA-6); nothing is copied per worker and no
file is reopened. The rows are concatenated in the order of the selected episodes, each
checked against its metadata (count and global `index`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodichain_models.data.lerobot.errors import LeRobotFormatError
from embodichain_models.data.lerobot.metadata import (
    Episode,
    LeRobotMeta,
    parquet_columns,
    read_parquet,
)


@dataclass
class Tables:
    """Rows of the selected episodes: `columns[key][row]`, `images[key][row]` (PNG bytes)."""

    columns: dict[str, np.ndarray]
    images: dict[str, Any]
    data_files: list[Path]

    def __len__(self) -> int:
        return len(self.columns["index"])


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


def _image_bytes(column: Any, path: Path, key: str) -> Any:
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_struct(column.type):  # the Hugging Face Image feature: {bytes, path}
        column = column.field("bytes")
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise LeRobotFormatError(f"{path}: image column {key!r} holds {column.type}, not "
                                 "encoded image bytes")
    return column


def read_tables(meta: LeRobotMeta, episodes: list[Episode], keys: list[str] | None = None
                ) -> Tables:
    """The rows of `episodes` (in that order) from their parquet files, each file read once;
    of the features, only those in `keys` (default all), so an unselected camera's image
    bytes are never read."""
    import pyarrow as pa

    by_file: dict[str, list[Episode]] = defaultdict(list)
    for episode in episodes:
        by_file[episode.data_file].append(episode)
    selected = meta.column_keys if keys is None else [k for k in meta.column_keys if k in keys]
    wanted = list(dict.fromkeys([*selected, "timestamp", "frame_index",
                                 "episode_index", "index", "task_index"]))
    pieces: dict[str, dict[int, Any]] = {k: {} for k in wanted}
    files = []
    for name, members in by_file.items():
        path = meta.root / name
        files.append(path)
        present = set(parquet_columns(path))  # the footer: the rows are read below
        missing = [k for k in wanted if k not in present]
        if missing:
            raise LeRobotFormatError(f"{path}: no column {missing[0]!r} (meta/info.json lists "
                                     "it as a feature)")
        table = read_parquet(path, wanted)
        episode_of_row = _as_numpy(table.column("episode_index"), path, "episode_index")
        for episode in members:
            rows = np.flatnonzero(episode_of_row == episode.index)
            if len(rows) != episode.length:
                raise LeRobotFormatError(
                    f"{path} holds {len(rows)} rows of episode {episode.index}, but its "
                    f"metadata says {episode.length}")
            part = table.take(pa.array(rows))
            index = _as_numpy(part.column("index"), path, "index")
            expected = np.arange(episode.start, episode.start + episode.length)
            if not np.array_equal(index, expected):
                raise LeRobotFormatError(
                    f"{path}: the rows of episode {episode.index} have index "
                    f"{index[0]}..{index[-1]} (not in order from {episode.start})")
            for key in wanted:
                pieces[key][episode.index] = part.column(key)
    columns: dict[str, np.ndarray] = {}
    images: dict[str, Any] = {}
    order = [e.index for e in episodes]
    for key in wanted:
        if key in meta.image_keys:
            images[key] = _image_bytes(
                pa.chunked_array([c for e in order for c in pieces[key][e].chunks]), files[0],
                key)
        else:
            columns[key] = np.concatenate([_as_numpy(pieces[key][e], files[0], key)
                                           for e in order])
    return Tables(columns=columns, images=images, data_files=files)
