"""Write a LeRobot dataset (v3.0, or v2.1) from episodes in memory, without `lerobot`.

The layout and metadata are those lerobot's recorder writes (`LeRobotDataset.create`,
`add_frame`, `save_episode`, `finalize`): v3.0 packs `episodes_per_file` episodes into each
data parquet file and each video file (a video's episodes follow one another; each
episode's `from_timestamp` says where it starts); v2.1 writes one of each per episode.
Video features are encoded with PyAV (`libx264`, yuv420p, a keyframe every 2 frames);
image features are stored in the parquet rows as PNG bytes (the Hugging Face `Image`
struct). Statistics (mean, std, min, max, count; images per channel in [0, 1]) go to
`meta/stats.json` (v3.0) or `meta/episodes_stats.jsonl` (v2.1).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embodichain_models.data.lerobot.metadata import aggregate_stats
from embodichain_models.data.lerobot.video import encode_png, encode_video

V30_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}


@dataclass
class EpisodeData:
    """One episode: its task and per-frame values `[T, ...]` for each feature (numeric
    features as arrays of their dtype, images and video frames uint8 `[T, H, W, 3]`)."""

    task: str
    values: dict[str, np.ndarray]

    @property
    def length(self) -> int:
        return len(next(iter(self.values.values())))


def feature(dtype: str, shape: tuple[int, ...], names: list[str] | None = None
            ) -> dict[str, Any]:
    """An entry of info.json's `features`; images and videos are `(H, W, 3)`."""
    if dtype in ("image", "video"):
        names = ["height", "width", "channels"]
    return {"dtype": dtype, "shape": list(shape), "names": names}


def _stats(values: np.ndarray, visual: bool) -> dict[str, np.ndarray]:
    if visual:  # per channel, in [0, 1], shaped (3, 1, 1) as lerobot's
        x = values.reshape(-1, values.shape[-1]).astype(np.float64) / 255.0
        shape: tuple[int, ...] = (-1, 1, 1)
    else:
        x = values.reshape(len(values), -1).astype(np.float64)
        shape = (-1,)
    return {"mean": x.mean(0).reshape(shape), "std": x.std(0).reshape(shape),
            "min": x.min(0).reshape(shape), "max": x.max(0).reshape(shape),
            "count": np.array([len(values)])}


def tasks_table(tasks: list[str]) -> Any:
    """v3.0's meta/tasks.parquet as lerobot writes it: a pandas frame whose index is the task
    text (`index_columns: ["task"]` in the pandas metadata), so that lerobot's reader
    (`pd.read_parquet`, then `tasks.iloc[i].name`) finds the text, not a row number."""
    import pyarrow as pa

    column = {"field_name": "task", "name": "task", "pandas_type": "unicode",
              "numpy_type": "object", "metadata": None}
    pandas = {"index_columns": ["task"], "column_indexes": [],
              "columns": [{"field_name": "task_index", "name": "task_index",
                           "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
                          column]}
    table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                      "task": pa.array(tasks, pa.string())})
    return table.replace_schema_metadata({"pandas": json.dumps(pandas)})


def _jsonable(stats: dict[str, dict[str, np.ndarray]]) -> dict[str, Any]:
    return {k: {n: v.tolist() for n, v in entry.items()} for k, entry in stats.items()}


def _table(features: dict[str, dict], rows: dict[str, list[np.ndarray]]):
    import pyarrow as pa

    arrays, names = [], []
    for key, parts in rows.items():
        spec = features[key]
        values = np.concatenate(parts)
        if spec["dtype"] == "image":
            array = pa.StructArray.from_arrays(
                [pa.array([encode_png(v) for v in values], pa.binary()),
                 pa.array([None] * len(values), pa.string())], names=["bytes", "path"])
        elif values.ndim == 1:
            array = pa.array(values)
        else:
            flat = pa.array(values.reshape(-1))
            array = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(values.shape[1:])))
        arrays.append(array)
        names.append(key)
    return pa.Table.from_arrays(arrays, names=names)


def write_dataset(root: str | Path, episodes: list[EpisodeData], features: dict[str, dict],
                  fps: int, *, version: str = "v3.0", episodes_per_file: int = 50,
                  chunks_size: int = 1000, robot_type: str | None = None,
                  overwrite: bool = False) -> Path:
    """Write `episodes` as a LeRobot dataset at `root` (refused if it exists, unless
    `overwrite`); `features` excludes the bookkeeping columns, which are added."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"version {version!r}: write v3.0 or v2.1")
    root = Path(root)
    if root.exists():
        if not overwrite:
            raise FileExistsError(f"{root} exists (pass overwrite=True to replace it)")
        shutil.rmtree(root)
    tasks = list(dict.fromkeys(e.task for e in episodes))
    videos = [k for k, f in features.items() if f["dtype"] == "video"]
    columns = [k for k in features if k not in videos]
    per_file = episodes_per_file if version == "v3.0" else 1
    all_features = {**features, **DEFAULT_FEATURES}
    episode_rows, episode_stats = [], []
    start = 0
    for first in range(0, len(episodes), per_file):
        group = episodes[first:first + per_file]
        file_number = first // per_file
        where = {"chunk_index": file_number // chunks_size, "file_index": file_number % chunks_size}
        rows: dict[str, list[np.ndarray]] = {k: [] for k in [*columns, *DEFAULT_FEATURES]}
        video_frames: dict[str, list[np.ndarray]] = {k: [] for k in videos}
        offset_in_file = 0
        for number, episode in enumerate(group, start=first):
            n = episode.length
            for key in columns:
                rows[key].append(np.asarray(episode.values[key]))
            rows["timestamp"].append((np.arange(n) / fps).astype(np.float32))
            rows["frame_index"].append(np.arange(n, dtype=np.int64))
            rows["episode_index"].append(np.full(n, number, dtype=np.int64))
            rows["index"].append(np.arange(start, start + n, dtype=np.int64))
            rows["task_index"].append(np.full(n, tasks.index(episode.task), dtype=np.int64))
            record: dict[str, Any] = {
                "episode_index": number, "tasks": [episode.task], "length": n,
                "data/chunk_index": where["chunk_index"], "data/file_index": where["file_index"],
                "dataset_from_index": start, "dataset_to_index": start + n}
            for key in videos:
                video_frames[key].append(episode.values[key])
                record.update({f"videos/{key}/chunk_index": where["chunk_index"],
                               f"videos/{key}/file_index": where["file_index"],
                               f"videos/{key}/from_timestamp": offset_in_file / fps,
                               f"videos/{key}/to_timestamp": (offset_in_file + n) / fps})
            record.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            episode_rows.append(record)
            stats = {k: _stats(np.asarray(episode.values[k]), features[k]["dtype"]
                               in ("image", "video")) for k in features}
            stats.update({k: _stats(rows[k][-1], False) for k in DEFAULT_FEATURES})
            episode_stats.append(stats)
            offset_in_file += n
            start += n
        if version == "v3.0":
            data_path = root / V30_DATA.format(**where)
        else:
            data_path = root / V21_DATA.format(episode_chunk=first // chunks_size,
                                               episode_index=first)
        data_path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_table(all_features, rows), data_path)
        for key in videos:
            path = (root / V30_VIDEO.format(video_key=key, **where) if version == "v3.0" else
                    root / V21_VIDEO.format(video_key=key, episode_chunk=first // chunks_size,
                                            episode_index=first))
            encode_video(path, np.concatenate(video_frames[key]), fps)
    meta = root / "meta"
    meta.mkdir(parents=True, exist_ok=True)
    info = {"codebase_version": version, "robot_type": robot_type,
            "total_episodes": len(episodes), "total_frames": start, "total_tasks": len(tasks),
            "chunks_size": chunks_size, "fps": fps, "splits": {"train": f"0:{len(episodes)}"},
            "data_path": V30_DATA if version == "v3.0" else V21_DATA,
            "video_path": (V30_VIDEO if version == "v3.0" else V21_VIDEO) if videos else None,
            "features": {k: dict(v, **({"info": {"video.fps": fps, "video.codec": "h264",
                                                 "video.pix_fmt": "yuv420p",
                                                 "has_audio": False}}
                                       if v["dtype"] == "video" else {}))
                         for k, v in all_features.items()}}
    if version == "v3.0":
        info.update(data_files_size_in_mb=100, video_files_size_in_mb=200)
        pq.write_table(tasks_table(tasks), meta / "tasks.parquet")
        (meta / "episodes/chunk-000").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(episode_rows),
                       meta / "episodes/chunk-000/file-000.parquet")
        (meta / "stats.json").write_text(json.dumps(_jsonable(aggregate_stats(episode_stats)),
                                                    indent=2))
    else:
        info.update(total_chunks=(len(episodes) - 1) // chunks_size + 1,
                    total_videos=len(episodes) * len(videos))
        _write_jsonl(meta / "tasks.jsonl", [{"task_index": i, "task": t}
                                            for i, t in enumerate(tasks)])
        _write_jsonl(meta / "episodes.jsonl", [{"episode_index": r["episode_index"],
                                                "tasks": r["tasks"], "length": r["length"]}
                                               for r in episode_rows])
        _write_jsonl(meta / "episodes_stats.jsonl",
                     [{"episode_index": i, "stats": _jsonable(s)}
                      for i, s in enumerate(episode_stats)])
    (meta / "info.json").write_text(json.dumps(info, indent=2))
    return root


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
