"""`LeRobotFrames`: a local LeRobot dataset as a map-style dataset, example for example
like lerobot's `LeRobotDataset`.

`dataset[i]` is the i-th frame of the selected episodes: every feature as a tensor (images
and video frames float `[C, H, W]` in [0, 1]), `timestamp`, `frame_index`,
`episode_index`, `index`, `task_index`. `delta_timestamps={key: [seconds, ...]}` stacks a
window of that feature around the frame (`[len(deltas), ...]`), with `<key>_is_pad` marking
the offsets beyond either end of the episode (there the edge frame is repeated, as in
lerobot). Video frames are taken by timestamp, within `tolerance_s`. `features=[key, ...]`
keeps only those features: the others (a camera the model does not use) are neither read,
decoded nor checked.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from embodichain.core.data.digests import cache_key, computed_once
from embodichain_models.data.lerobot.errors import LeRobotFormatError
from embodichain_models.data.lerobot.metadata import BOOKKEEPING, Episode, read_meta
from embodichain_models.data.lerobot.tables import read_tables
from embodichain_models.data.lerobot.video import (
    VideoFrames,
    decode_png,
    first_frame_missing,
    video_length_s,
)

NORMALIZATIONS = ("mean_std", "min_max")
_EPS = 1e-8


class LeRobotFrames:
    """The frames of a local LeRobot dataset (v3.0 or v2.1); see the module docstring.

    - `episodes`: the episode indices to use (default all), e.g. a held-out validation set.
    - `normalize={key: "mean_std" | "min_max"}`: applied to that feature (windows and
      pads included) with `meta/stats.json`: `(x - mean) / std`, or to [-1, 1] by min/max.
    - `task_text=True` adds `task` (the text) to each example: useful outside the trainer,
      which moves tensors only.
    - `features`: the features an example holds (default all of `meta/info.json`'s);
      the others are not read from the tables, and their videos neither checked nor
      decoded. Keys of `delta_timestamps` and `normalize` must be among them.
    - `check_videos`: check at start-up that each selected video holds the frames its
      table needs (refuses a video shorter than its table, e.g. cut short).
    """

    def __init__(self, root: str | Path, *, delta_timestamps: Mapping[str, Sequence[float]]
                 | None = None, episodes: Sequence[int] | None = None,
                 tolerance_s: float = 1e-4, normalize: Mapping[str, str] | None = None,
                 task_text: bool = False, check_videos: bool = True,
                 features: Sequence[str] | None = None) -> None:
        self.meta = meta = read_meta(root)
        self.root, self.fps, self.tolerance_s = meta.root, meta.fps, tolerance_s
        self.task_text = task_text
        known = {e.index: e for e in meta.episodes}
        if episodes is None:
            chosen = list(meta.episodes)
        else:
            unknown = [e for e in episodes if e not in known]
            if unknown:
                raise LeRobotFormatError(
                    f"{self.root}: episode {unknown[0]} is not in the dataset (it has "
                    f"{len(known)} episodes, {min(known)}..{max(known)})")
            chosen = [known[e] for e in episodes]
        if not chosen:
            raise LeRobotFormatError(f"{self.root}: no episodes selected")
        self.episodes: list[Episode] = chosen
        self.keys = self._check_features(features)
        self.features = {k: v for k, v in meta.features.items()
                         if k in self.keys or k not in meta.tensor_keys}
        self.delta_indices = self._check_deltas(dict(delta_timestamps or {}))
        self.delta_timestamps = {k: [float(d) for d in v]
                                 for k, v in (delta_timestamps or {}).items()}
        self.normalize = self._check_normalize(dict(normalize or {}))
        self.tables = read_tables(meta, chosen, self.keys)
        lengths = np.array([e.length for e in chosen])
        self._ends = np.cumsum(lengths)
        self._starts = self._ends - lengths
        self._length = int(self._ends[-1])
        if check_videos:
            self._check_videos()
        self._videos = VideoFrames(tolerance_s)

    # --- checks at start-up (LeRobotFormatError, i.e. exit 2 from a factory) ---

    def _check_features(self, features: Sequence[str] | None) -> list[str]:
        """The selected tensor features, in the dataset's order (all by default)."""
        known = self.meta.tensor_keys
        if features is None:
            return list(known)
        if isinstance(features, str):
            features = [features]
        unknown = [k for k in features if k not in known and k not in BOOKKEEPING]
        if unknown:
            raise LeRobotFormatError(
                f"features names {unknown[0]!r}, which the dataset at {self.root} does not "
                f"have (its features: {', '.join(known)})")
        return [k for k in known if k in features]

    def _check_deltas(self, deltas: dict[str, Sequence[float]]) -> dict[str, np.ndarray]:
        indices = {}
        for key, offsets in deltas.items():
            if key not in self.keys:
                left_out = key in self.meta.tensor_keys
                raise LeRobotFormatError(
                    f"delta_timestamps names {key!r}, which "
                    + ("features= leaves out" if left_out else
                       f"the dataset at {self.root} does not have")
                    + f" (its features: {', '.join(self.keys)})")
            if not offsets:
                raise LeRobotFormatError(f"delta_timestamps[{key!r}] is empty")
            steps = []
            for seconds in offsets:
                frames = float(seconds) * self.fps
                if abs(frames - round(frames)) / self.fps > self.tolerance_s:
                    raise LeRobotFormatError(
                        f"delta_timestamps[{key!r}]: {seconds} s is not a whole number of "
                        f"frames at the fps of the dataset at {self.root} (fps {self.fps}, "
                        f"frames every {1 / self.fps:.4g} s), within tolerance_s="
                        f"{self.tolerance_s}")
                steps.append(round(frames))
            indices[key] = np.array(steps, dtype=np.int64)
        return indices

    def _check_normalize(self, normalize: dict[str, str]
                         ) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]]:
        out = {}
        for key, mode in normalize.items():
            if mode not in NORMALIZATIONS:
                raise LeRobotFormatError(f"normalize[{key!r}]: {mode!r} is not one of "
                                         f"{', '.join(NORMALIZATIONS)}")
            if key in self.meta.tensor_keys and key not in self.keys:
                raise LeRobotFormatError(f"normalize names {key!r}, which features= leaves "
                                         f"out (its features: {', '.join(self.keys)})")
            stats = self.meta.stats.get(key)
            needs = ("mean", "std") if mode == "mean_std" else ("min", "max")
            if key not in self.keys or not stats or not all(n in stats for n in needs):
                raise LeRobotFormatError(
                    f"normalize[{key!r}]: the dataset at {self.root} has no "
                    f"{'/'.join(needs)} statistics of {key!r} in meta/stats.json")
            a, b = (torch.from_numpy(np.asarray(stats[n], dtype=np.float32)) for n in needs)
            if mode == "mean_std":
                out[key] = (mode, a, b.clamp_min(_EPS))  # (x - mean) / std
            else:
                out[key] = (mode, a, (b - a).clamp_min(_EPS))  # 2 (x - min) / (max - min) - 1
        return out

    def _check_videos(self) -> None:
        """Refuse a selected video that lacks frames its table needs: shorter by its header,
        or cut short (the header intact, the last frames' bytes gone), naming the file and
        the first episode it fails."""
        needs: dict[str, list[tuple[float, int]]] = defaultdict(list)  # file -> [(t, episode)]
        stamps = self.tables.columns["timestamp"]
        for slot, episode in enumerate(self.episodes):
            last = float(stamps[int(self._ends[slot]) - 1])  # its last frame's time
            for key, (name, start) in episode.videos.items():
                if key in self.keys:
                    needs[name].append((start + last, episode.index))
        rows = {e.index: e.length for e in self.episodes}
        for name, wanted in needs.items():
            wanted.sort()
            path = self.root / name
            if not path.is_file():
                raise LeRobotFormatError(f"{path} is missing (episode {wanted[0][1]}'s video)")
            # Once per machine (R-SCALE-2): the first process checks the file while the
            # others wait, then all (and every later start) read the verdict, which is kept
            # under the file's cache key (a replaced or touched file is checked again).
            file_key = cache_key(path)
            key = hashlib.sha256(json.dumps([file_key, wanted, self.tolerance_s,
                                             self.fps]).encode()).hexdigest()
            verdict = computed_once(  # the lambdas run here, before the next file
                "lerobot-video-checks", key,
                lambda: {"problem": self._video_problem(path, wanted, rows)},  # noqa: B023
                valid=lambda record: isinstance(record, dict) and "problem" in record,
                unchanged=lambda: cache_key(path) == file_key)  # noqa: B023
            if verdict["problem"] is not None:
                raise LeRobotFormatError(verdict["problem"])

    def _video_problem(self, path: Path, wanted: list[tuple[float, int]],
                       rows: dict[int, int]) -> str | None:
        """What is wrong with a video file that must hold frames up to each episode's
        (time, episode) in `wanted` (sorted), or None."""
        last, episode = wanted[-1]
        seconds, frames = video_length_s(path, episode)
        if seconds + self.tolerance_s < last + 0.5 / self.fps:
            return (f"{path} is shorter than its table: it holds {frames} frames "
                    f"({seconds:.3f} s), but episode {episode} ({rows[episode]} rows) needs "
                    f"frames up to {last + 1 / self.fps:.3f} s")
        cut = first_frame_missing(path, wanted, self.tolerance_s)
        if cut is not None:
            return (f"{path} is cut short: episode {cut[1]}'s last frame (t={cut[0]:.3f} s) "
                    f"is not in the file, though its header lists {frames} frames (a copy or "
                    "download that stopped early?)")
        return None

    # --- examples ---

    def __len__(self) -> int:
        return self._length

    def episode_of(self, position: int) -> tuple[Episode, int, int]:
        """The episode holding example `position`, its first row and the offset in it."""
        slot = int(np.searchsorted(self._ends, position, side="right"))
        start = int(self._starts[slot])
        return self.episodes[slot], start, position - start

    def task(self, task_index: int) -> str:
        return self.meta.tasks[task_index]

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        position = int(position)
        if not 0 <= position < self._length:
            raise IndexError(f"example {position} of {self._length}")
        episode, first_row, offset = self.episode_of(position)
        columns = self.tables.columns
        example: dict[str, torch.Tensor] = {}
        rows_of: dict[str, np.ndarray] = {}
        for key, steps in self.delta_indices.items():
            wanted = offset + steps
            rows_of[key] = first_row + np.clip(wanted, 0, episode.length - 1)
            example[f"{key}_is_pad"] = torch.from_numpy((wanted < 0) | (wanted >= episode.length))
        row = first_row + offset
        for key in self.keys:
            rows = rows_of.get(key)
            picked = np.array([row]) if rows is None else rows
            if key in self.meta.video_keys:
                value = self._video(key, episode, picked)
            elif key in self.meta.image_keys:
                value = self._images(key, episode, picked)
            else:
                value = torch.from_numpy(columns[key][picked])
            example[key] = value[0] if rows is None else value
        for key in BOOKKEEPING:
            example.setdefault(key, torch.from_numpy(columns[key][row:row + 1])[0])
        for key, (mode, shift, scale) in self.normalize.items():
            value = example[key].to(torch.float32)
            example[key] = ((value - shift) / scale if mode == "mean_std"
                            else 2 * (value - shift) / scale - 1)
        if self.task_text:
            example["task"] = self.task(int(example["task_index"]))  # type: ignore[assignment]
        return example

    def _images(self, key: str, episode: Episode, rows: np.ndarray) -> torch.Tensor:
        column = self.tables.images[key]
        frames = self.tables.columns["frame_index"]
        images = [decode_png(column[int(r)],
                             f"episode {episode.index}, frame {int(frames[r])}, image {key!r} "
                             f"in {self.root / episode.data_file}") for r in rows]
        return _chw(np.stack(images))

    def _video(self, key: str, episode: Episode, rows: np.ndarray) -> torch.Tensor:
        name, start = episode.videos[key]
        times = [start + float(t) for t in self.tables.columns["timestamp"][rows]]
        frames = [int(f) for f in self.tables.columns["frame_index"][rows]]
        decoded = self._videos.frames(self.root / name, times, episode.index, frames)
        return _chw(decoded)


def _chw(images: np.ndarray) -> torch.Tensor:
    """uint8 `[N, H, W, C]` as float `[N, C, H, W]` in [0, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div_(255.0)

