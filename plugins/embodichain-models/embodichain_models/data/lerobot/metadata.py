"""The metadata of a local LeRobot dataset, format v3.0 or v2.1, read without `lerobot`.

v3.0 (`lerobot` ≥ 0.4): `meta/info.json`, `meta/stats.json`, `meta/tasks.parquet`,
`meta/episodes/chunk-*/file-*.parquet` (one row per episode: its rows
`dataset_from_index`..`dataset_to_index` in the data file `data/chunk_index`,
`data/file_index`, and per video key the video file and the episode's `from_timestamp` in
it); many episodes per data and per video file.

v2.1: `meta/info.json`, `meta/episodes.jsonl`, `meta/tasks.jsonl`,
`meta/episodes_stats.jsonl` (and sometimes `meta/stats.json`), one parquet file and one
video per episode under `chunk-{episode_index // chunks_size}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from embodichain_models.data.lerobot.errors import LeRobotFormatError

SUPPORTED_VERSIONS = ("v2.1", "v3.0")
INFO = "meta/info.json"
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


@dataclass(frozen=True)
class Episode:
    """Where one episode's rows and frames are."""

    index: int
    """`episode_index`."""
    start: int
    """`dataset_from_index`: the global `index` of its first row."""
    length: int
    data_file: str
    """Its parquet file, relative to the dataset root."""
    videos: dict[str, tuple[str, float]] = field(default_factory=dict)
    """Per video key: the video file (relative) and the episode's `from_timestamp` in it."""


@dataclass
class LeRobotMeta:
    """What `meta/` says: version, fps, features, stats, tasks, episodes (in index order)."""

    root: Path
    version: str
    fps: int
    features: dict[str, dict[str, Any]]
    tasks: list[str]
    """Task text by `task_index`."""
    episodes: list[Episode]
    stats: dict[str, dict[str, np.ndarray]]
    meta_files: list[Path]
    """Every metadata file read (for the identity)."""

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "video"]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "image"]

    @property
    def tensor_keys(self) -> list[str]:
        """The features an example holds (text features, which are no tensors, are left out)."""
        return [k for k, f in self.features.items() if f.get("dtype") != "string"]

    @property
    def column_keys(self) -> list[str]:
        """Features read from the parquet tables (all but the videos and text)."""
        return [k for k in self.tensor_keys if k not in self.video_keys]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise LeRobotFormatError(f"{path}: not valid JSON ({exc})") from None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise LeRobotFormatError(f"{path} is missing (a v2.1 LeRobot dataset has it)")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise LeRobotFormatError(f"{path}, line {number}: not valid JSON ({exc})"
                                         ) from None
    return rows


def read_parquet(path: Path, columns: list[str] | None = None):
    """A pyarrow table, or a LeRobotFormatError naming the file (corrupt, truncated, missing
    columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise LeRobotFormatError(f"{path} is missing")
    try:
        return pq.read_table(path, columns=columns, memory_map=True)
    except (pa.ArrowException, OSError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable parquet file ({exc})") from None


def parquet_columns(path: Path) -> list[str]:
    """The column names of a parquet file, from its footer (no rows read)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise LeRobotFormatError(f"{path} is missing")
    try:
        return list(pq.read_schema(path, memory_map=True).names)
    except (pa.ArrowException, OSError) as exc:
        raise LeRobotFormatError(f"{path}: not a readable parquet file ({exc})") from None


def read_info(root: Path) -> dict[str, Any]:
    path = root / INFO
    if not path.is_file():
        raise LeRobotFormatError(f"{path} is missing: {root} is not a LeRobot dataset "
                                 "(its meta/info.json describes the features)")
    info = _json(path)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version not in SUPPORTED_VERSIONS:
        raise LeRobotFormatError(
            f"{path}: codebase_version {version!r} is not supported (this reader reads "
            f"{' and '.join(SUPPORTED_VERSIONS)}; convert older datasets with lerobot's "
            "conversion scripts)")
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise LeRobotFormatError(f"{path}: no {key!r}")
    return info


def require_extra() -> None:
    """An ImportError saying how to install pyarrow and PyAV when either is missing."""
    for module in ("pyarrow", "av"):
        try:
            __import__(module)
        except ImportError as exc:
            raise ImportError(f"reading LeRobot datasets needs {module}: pip install "
                              "'embodichain-models[lerobot]'") from exc


def read_meta(root: str | Path) -> LeRobotMeta:
    """Read and check a dataset's metadata (no table rows, no video frames)."""
    require_extra()
    root = Path(root)
    info = read_info(root)
    if info["codebase_version"] == "v3.0":
        tasks, episodes, stats, files = _v30(root, info)
    else:
        tasks, episodes, stats, files = _v21(root, info)
    if not episodes:
        raise LeRobotFormatError(f"{root}: the dataset has no episodes")
    features = {k: dict(v) for k, v in info["features"].items()}
    return LeRobotMeta(root=root, version=info["codebase_version"], fps=int(info["fps"]),
                       features=features, tasks=tasks, episodes=episodes, stats=stats,
                       meta_files=[root / INFO, *files])


def _video_keys(info: dict[str, Any]) -> list[str]:
    return [k for k, f in info["features"].items() if f.get("dtype") == "video"]


def _v30(root: Path, info: dict[str, Any]):
    tasks_path = root / "meta/tasks.parquet"
    table = read_parquet(tasks_path)
    names = table.column_names
    text = "task" if "task" in names else "__index_level_0__"  # pandas keeps its index
    if text not in names or "task_index" not in names:
        raise LeRobotFormatError(f"{tasks_path}: needs the columns 'task' and 'task_index' "
                                 f"(has {names})")
    by_index = dict(zip(table.column("task_index").to_pylist(), table.column(text).to_pylist(),
                        strict=True))
    tasks = [by_index[i] for i in sorted(by_index)]
    episode_files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    if not episode_files:
        raise LeRobotFormatError(f"{root / 'meta/episodes'}: no chunk-*/file-*.parquet")
    videos = _video_keys(info)
    wanted = ["episode_index", "length", "dataset_from_index", "dataset_to_index",
              "data/chunk_index", "data/file_index"]
    for key in videos:
        wanted += [f"videos/{key}/chunk_index", f"videos/{key}/file_index",
                   f"videos/{key}/from_timestamp"]
    episodes = []
    for path in episode_files:
        table = read_parquet(path)
        missing = [c for c in wanted if c not in table.column_names]
        if missing:
            raise LeRobotFormatError(f"{path}: no column {missing[0]!r}")
        rows = table.select(wanted).to_pylist()
        for row in rows:
            data = info["data_path"].format(chunk_index=row["data/chunk_index"],
                                            file_index=row["data/file_index"])
            video_files = {
                key: (info["video_path"].format(video_key=key,
                                                chunk_index=row[f"videos/{key}/chunk_index"],
                                                file_index=row[f"videos/{key}/file_index"]),
                      float(row[f"videos/{key}/from_timestamp"]))
                for key in videos}
            length = int(row["length"])
            if int(row["dataset_to_index"]) - int(row["dataset_from_index"]) != length:
                raise LeRobotFormatError(
                    f"{path}: episode {row['episode_index']} has length {length} but rows "
                    f"{row['dataset_from_index']}..{row['dataset_to_index']}")
            episodes.append(Episode(int(row["episode_index"]), int(row["dataset_from_index"]),
                                    length, data, video_files))
    episodes.sort(key=lambda e: e.index)
    stats_path = root / "meta/stats.json"
    stats = _stats(_json(stats_path)) if stats_path.is_file() else {}
    files = [tasks_path, *episode_files] + ([stats_path] if stats_path.is_file() else [])
    return tasks, episodes, stats, files


def _v21(root: Path, info: dict[str, Any]):
    chunks = int(info.get("chunks_size", 1000))
    rows = _jsonl(root / "meta/tasks.jsonl")
    tasks_by_index = {int(r["task_index"]): str(r["task"]) for r in rows}
    tasks = [tasks_by_index[i] for i in sorted(tasks_by_index)]
    videos = _video_keys(info)
    episodes, start = [], 0
    for row in sorted(_jsonl(root / "meta/episodes.jsonl"), key=lambda r: r["episode_index"]):
        index, length = int(row["episode_index"]), int(row["length"])
        where = {"episode_chunk": index // chunks, "episode_index": index}
        video_files = {key: (info["video_path"].format(video_key=key, **where), 0.0)
                       for key in videos}
        episodes.append(Episode(index, start, length, info["data_path"].format(**where),
                                video_files))
        start += length
    files = [root / "meta/tasks.jsonl", root / "meta/episodes.jsonl"]
    stats_path, per_episode = root / "meta/stats.json", root / "meta/episodes_stats.jsonl"
    if stats_path.is_file():
        stats = _stats(_json(stats_path))
        files.append(stats_path)
    elif per_episode.is_file():
        stats = aggregate_stats([_stats(r["stats"]) for r in _jsonl(per_episode)])
        files.append(per_episode)
    else:
        stats = {}
    return tasks, episodes, stats, files


def _stats(raw: dict[str, Any]) -> dict[str, dict[str, np.ndarray]]:
    return {key: {name: np.atleast_1d(np.asarray(value, dtype=np.float64))
                  for name, value in entry.items()}
            for key, entry in raw.items() if isinstance(entry, dict)}


def aggregate_stats(parts: list[dict[str, dict[str, np.ndarray]]]
                    ) -> dict[str, dict[str, np.ndarray]]:
    """Pool per-episode mean/std/min/max/count into the dataset's (as lerobot does)."""
    pooled: dict[str, dict[str, np.ndarray]] = {}
    for key in parts[0] if parts else []:
        entries = [p[key] for p in parts if key in p]
        if not all({"mean", "std", "min", "max", "count"} <= set(e) for e in entries):
            continue
        counts = np.array([float(e["count"].reshape(-1)[0]) for e in entries])
        weights = (counts / counts.sum()).reshape(-1, *[1] * entries[0]["mean"].ndim)
        means = np.stack([e["mean"] for e in entries])
        mean = (weights * means).sum(0)
        var = (weights * (np.stack([e["std"] for e in entries]) ** 2
                          + (means - mean) ** 2)).sum(0)
        pooled[key] = {"mean": mean, "std": np.sqrt(var),
                       "min": np.min(np.stack([e["min"] for e in entries]), 0),
                       "max": np.max(np.stack([e["max"] for e in entries]), 0),
                       "count": np.array([counts.sum()])}
    return pooled
