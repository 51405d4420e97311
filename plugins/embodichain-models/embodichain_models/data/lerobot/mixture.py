"""Several LeRobot datasets as one weighted source: `lerobot_mixture` (R-SCALE-3).

The parts are concatenated (part i's examples at `[offset_i, offset_i + len_i)`) and the
source carries their `Parts` (names, sizes, weights), so the framework's sampler draws by
weight (`embodichain.core.data.mixture`); nothing here samples. Each example is its part's,
with `part_index` (the part it came from), and `episode_index` / `task_index` remapped to
the mixture-wide tables `episodes` ((part name, its episode index) by mixture index) and
`tasks` (each distinct task text once, in part order); `index` stays the part's own row.

Parts may differ in fps (windows in seconds are whole frames at each part's own fps, or
refused by name) and in key names (`lerobot_source(root, rename={their: our})`). When the
mixture is opened, the first example of every part is loaded and compared: a key one part
lacks, or a shape or dtype that would not batch with the first part's, is refused naming
the key and both parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodichain.core.errors import DataFormatError
from embodichain_models.data.lerobot.errors import LeRobotFormatError
from embodichain_models.data.lerobot.metadata import aggregate_stats
from embodichain_models.data.lerobot.renamed import normalized_keys, reader_of, stats_of

NORMALIZATIONS = ("per_part", "pooled")
_EPS = 1e-8


class MixtureFrames:
    """The parts' examples one after another; see the module docstring."""

    def __init__(self, names: Sequence[str], datasets: Sequence[Any],
                 normalize: Mapping[str, tuple[str, torch.Tensor, torch.Tensor]]) -> None:
        self.names, self.datasets = list(names), list(datasets)
        self.normalize = dict(normalize)  # pooled statistics; empty when per part
        sizes = np.array([len(d) for d in self.datasets])
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        readers = [reader_of(d)[0] for d in self.datasets]
        self.tasks: list[str] = list(dict.fromkeys(t for r in readers for t in r.meta.tasks))
        where = {text: i for i, text in enumerate(self.tasks)}
        self._task_maps = [np.array([where[t] for t in r.meta.tasks], dtype=np.int64)
                           for r in readers]
        self.episodes: list[tuple[str, int]] = [(name, e.index) for name, r in
                                                zip(self.names, readers, strict=True)
                                                for e in r.episodes]
        self._episode_maps: list[dict[int, int]] = []
        for name in self.names:
            self._episode_maps.append({index: i for i, (part, index) in
                                       enumerate(self.episodes) if part == name})

    def __len__(self) -> int:
        return int(self._ends[-1])

    def part_of(self, position: int) -> tuple[int, int]:
        """The part holding example `position` and the position within it."""
        part = int(np.searchsorted(self._ends, position, side="right"))
        return part, position - int(self._starts[part])

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        position = int(position)
        if not 0 <= position < len(self):
            raise IndexError(f"example {position} of {len(self)}")
        part, local = self.part_of(position)
        example = dict(self.datasets[part][local])
        for key, table in (("episode_index", self._episode_maps[part]),
                           ("task_index", self._task_maps[part])):
            value = example[key]
            example[key] = torch.tensor(table[int(value)], dtype=value.dtype)
        example["part_index"] = torch.tensor(part, dtype=torch.int64)
        for key, (mode, shift, scale) in self.normalize.items():
            value = example[key].to(torch.float32)
            example[key] = ((value - shift) / scale if mode == "mean_std"
                            else 2 * (value - shift) / scale - 1)
        return example


def pooled_normalization(names: Sequence[str], datasets: Sequence[Any],
                         normalize: Mapping[str, str]
                         ) -> dict[str, tuple[str, torch.Tensor, torch.Tensor]]:
    """Each key's statistics pooled over the parts, weighted by their counts (as lerobot
    aggregates an episode's into a dataset's), as (mode, shift, scale)."""
    from embodichain_models.data.lerobot.dataset import NORMALIZATIONS as MODES

    out = {}
    for key, mode in normalize.items():
        if mode not in MODES:
            raise LeRobotFormatError(f"normalize[{key!r}]: {mode!r} is not one of "
                                     f"{', '.join(MODES)}")
        entries = []
        for name, dataset in zip(names, datasets, strict=True):
            stats = {k: np.asarray(v, dtype=np.float64) for k, v in
                     stats_of(dataset).get(key, {}).items()}
            if not {"mean", "std", "min", "max", "count"} <= set(stats):
                raise LeRobotFormatError(
                    f"normalize[{key!r}] pooled: mixture part {name!r} "
                    f"({reader_of(dataset)[0].root}) has no mean/std/min/max/count of "
                    f"{key!r} in its meta/stats.json")
            entries.append({key: stats})
        pooled = aggregate_stats(entries)[key]
        needs = ("mean", "std") if mode == "mean_std" else ("min", "max")
        a, b = (torch.from_numpy(pooled[n].astype(np.float32)) for n in needs)
        out[key] = (mode, a, b.clamp_min(_EPS) if mode == "mean_std" else (b - a).clamp_min(_EPS))
    return out


def check_batchable(names: Sequence[str], datasets: Sequence[Any]) -> None:
    """Refuse parts whose examples would not stack (`check_parts_batch`: the first example
    of each part against the first part's, naming the key, both parts with their roots,
    shapes and dtypes), before their statistics are pooled; a LeRobotFormatError."""
    from embodichain.core.data.mixture import check_parts_batch

    labels = [f"{n!r} ({reader_of(d)[0].root})" for n, d in zip(names, datasets, strict=True)]
    try:
        check_parts_batch(names, [dataset[0] for dataset in datasets], labels=labels,
                          missing_hint=lambda key: (
                              f": map one of its keys to it with lerobot_source(root, "
                              f"rename={{their_key: {key!r}}}), or leave the key out with "
                              "features=[...]"))
    except DataFormatError as exc:
        raise LeRobotFormatError(str(exc)) from None


def part_names(parts: Sequence[Any], names: Sequence[str] | None) -> list[str]:
    """The given names, or each part's directory name (made unique with -2, -3, ...)."""
    if names is not None:
        names = [str(n) for n in names]
        if len(names) != len(parts):
            raise LeRobotFormatError(f"names= has {len(names)} names for {len(parts)} parts")
        return names
    out: list[str] = []
    for what in parts:
        dataset = getattr(what, "dataset", None)
        base = Path(reader_of(dataset)[0].root if dataset is not None else what).name
        name, n = base, 1
        while name in out:
            n += 1
            name = f"{base}-{n}"
        out.append(name)
    return out


def check_weight(name: str, weight: Any) -> float:
    try:
        value = float(weight)
    except (TypeError, ValueError):
        value = float("nan")
    if not (np.isfinite(value) and value > 0):
        raise LeRobotFormatError(f"mixture part {name!r}: weight {weight!r} is not a positive "
                                 "number")
    return value


def refuse_double_normalization(name: str, dataset: Any) -> None:
    own = normalized_keys(dataset)
    if own:
        raise LeRobotFormatError(
            f"mixture part {name!r} normalises {', '.join(sorted(own))} itself, and "
            "normalization='pooled' would normalise again: build it without normalize=")
