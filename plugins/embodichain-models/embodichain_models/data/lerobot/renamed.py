"""A LeRobot dataset's features under other names: `lerobot_source(root, rename={their_key:
our_key})`, so that datasets recorded with other key names give one set of keys (a mixture).

The options that name features (`delta_timestamps`, `normalize`, `features`) are given in
our names and passed to the reader in theirs; examples come back in ours (`<key>_is_pad`
too), and so do the statistics.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.errors import LeRobotFormatError
from embodichain_models.data.lerobot.metadata import BOOKKEEPING, read_meta

_NAMED = ("delta_timestamps", "normalize")


def check_rename(root: str | Path, rename: Mapping[str, str]) -> dict[str, str]:
    """`rename` checked against the dataset's features: each key one it has, no bookkeeping
    column, no two features under one name."""
    meta = read_meta(root)
    rename = dict(rename)
    for theirs, ours in rename.items():
        if theirs in BOOKKEEPING or ours in BOOKKEEPING:
            raise LeRobotFormatError(f"rename: {theirs!r} -> {ours!r}: the bookkeeping "
                                     f"columns ({', '.join(BOOKKEEPING)}) keep their names")
        if theirs not in meta.tensor_keys:
            raise LeRobotFormatError(
                f"rename names {theirs!r}, which the dataset at {meta.root} does not have "
                f"(its features: {', '.join(meta.tensor_keys)})")
    names = [rename.get(k, k) for k in meta.tensor_keys]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise LeRobotFormatError(f"rename gives two features of the dataset at {meta.root} "
                                 f"the name {twice[0]!r}")
    return rename


def reader_options(rename: Mapping[str, str], options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with the feature names in them turned back into the dataset's own."""
    theirs = {ours: their for their, ours in rename.items()}
    out = dict(options)
    for name in _NAMED:
        if out.get(name) is not None:
            out[name] = {theirs.get(k, k): v for k, v in out[name].items()}
    if out.get("features") is not None:
        features = [out["features"]] if isinstance(out["features"], str) else out["features"]
        out["features"] = [theirs.get(k, k) for k in features]
    return out


class RenamedFrames:
    """`LeRobotFrames` whose examples and statistics use our names (`frames` is the reader)."""

    def __init__(self, frames: LeRobotFrames, rename: Mapping[str, str]) -> None:
        self.frames, self.rename = frames, dict(rename)
        self._names = {**{f"{k}_is_pad": f"{v}_is_pad" for k, v in self.rename.items()},
                       **self.rename}

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        return {self._names.get(k, k): v for k, v in self.frames[position].items()}

    def __getattr__(self, name: str) -> Any:  # root, fps, meta, episodes, ... of the reader
        if name == "frames":
            raise AttributeError(name)
        return getattr(self.frames, name)


def reader_of(dataset: Any) -> tuple[LeRobotFrames, dict[str, str]]:
    """The reader under a LeRobot dataset and its renaming (none for a plain one)."""
    if isinstance(dataset, RenamedFrames):
        return dataset.frames, dataset.rename
    if isinstance(dataset, LeRobotFrames):
        return dataset, {}
    raise LeRobotFormatError(f"{type(dataset).__name__} is not a LeRobot dataset (a mixture's "
                             "parts are roots or lerobot_source(...) sources)")


def stats_of(dataset: Any) -> dict[str, dict[str, np.ndarray]]:
    """The dataset's `meta/stats.json` under our names."""
    frames, rename = reader_of(dataset)
    return {rename.get(k, k): v for k, v in frames.meta.stats.items()}


def normalized_keys(dataset: Any) -> dict[str, str]:
    """The features the reader normalises itself, under our names, and how."""
    frames, rename = reader_of(dataset)
    return {rename.get(k, k): mode for k, (mode, _, _) in frames.normalize.items()}
