"""The cart-pole recipe's training source and held-out examples: one LeRobot dataset
(`data.root`) or a weighted mixture (`data.mixture`, R-SCALE-3). In both, each part's last
`data.val_episodes` episodes are held out; a mixture's are validated part by part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from embodichain.learning.sl import DatasetSource, UsageError
from embodichain_models.data.cartpole.prepare import IMAGE_KEY
from embodichain_models.data.lerobot import lerobot_mixture, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.errors import LeRobotFormatError
from embodichain_models.data.lerobot.metadata import aggregate_stats, read_meta
from embodichain_models.data.lerobot.renamed import stats_of
from embodichain_models.envs.cartpole.task import FPS
from embodichain_models.policies.cartpole_bc.schema import BcConfig

USED_FEATURES = (IMAGE_KEY, "observation.state", "action")


@dataclass
class BcData:
    source: DatasetSource
    held_out: dict[str, Any]
    """Held-out examples by part name ("" for a single dataset)."""
    stats: dict[str, dict[str, np.ndarray]]
    """The statistics the policy scales by (a mixture's pooled, or its first part's)."""
    size: int
    """The camera's image size (of the first part), from its metadata."""


def dataset_options(config: BcConfig, fps: int) -> dict:
    data = config.data
    return {"delta_timestamps": {IMAGE_KEY: [(i - data.frames + 1) / fps
                                             for i in range(data.frames)],
                                 "action": [i / fps for i in range(data.chunk)]},
            "normalize": {"action": "mean_std"}, "tolerance_s": data.tolerance_s,
            # What the policy reads: other cameras of a dataset are neither read nor checked.
            "features": list(USED_FEATURES)}


def _split(root: Any, episodes: list[int] | None, held: int) -> tuple[list[int], list[int]]:
    indices = episodes if episodes is not None else [e.index for e in read_meta(root).episodes]
    if len(indices) <= held:
        raise UsageError(f"{root} has {len(indices)} episodes: too few to hold out "
                         f"data.val_episodes={held} and train on the rest")
    return indices[:-held], indices[-held:]


def bc_data(config: BcConfig) -> BcData:
    """The source, held-out examples and statistics `data` describes."""
    data = config.data
    if data.mixture is None:
        meta = read_meta(data.root)
        options = dataset_options(config, meta.fps)
        train, held = _split(data.root, None, data.val_episodes)
        source = lerobot_source(data.root, episodes=train, identity=data.identity, **options)
        return BcData(source, {"": LeRobotFrames(data.root, episodes=held, **options)},
                      meta.stats, int(meta.features[IMAGE_KEY]["shape"][0]))
    first = read_meta(data.mixture[0].root)
    theirs = {ours: their for their, ours in data.mixture[0].rename.items()}
    size = int(first.features[theirs.get(IMAGE_KEY, IMAGE_KEY)]["shape"][0])
    # Windows in seconds at the policy's control rate, whatever the parts' order: each part
    # serves them at its own fps, or is refused naming it, its root, the key and its fps.
    options = dataset_options(config, FPS)
    common = {"names": [p.name for p in data.mixture], "normalization": data.normalization}
    if data.normalization == "pooled":
        common["normalize"] = options.pop("normalize")
    trains, helds = [], []
    for part in data.mixture:
        train, held = _split(part.root, part.episodes, data.val_episodes)
        for episodes, into in ((train, trains), (held, helds)):
            try:
                opened = lerobot_source(part.root, episodes=episodes, identity=data.identity,
                                        rename=part.rename or None, **options)
            except LeRobotFormatError as exc:
                raise LeRobotFormatError(f"data.mixture part {part.name!r} ({part.root}): "
                                         f"{exc}") from None
            into.append((opened, part.weight))
    source = lerobot_mixture(trains, **common)
    held_out = lerobot_mixture(helds, **common).dataset
    stats = [stats_of(d) for d in source.dataset.datasets]
    pooled = aggregate_stats(stats) if data.normalization == "pooled" else stats[0]
    return BcData(source, {p.name: _PartView(held_out, i) for i, p in
                           enumerate(data.mixture)}, pooled, size)


class _PartView:
    """Part `part`'s examples of a held-out mixture (normalised as in training)."""

    def __init__(self, mixture: Any, part: int) -> None:
        self.mixture = mixture
        self.start = sum(len(d) for d in mixture.datasets[:part])
        self.length = len(mixture.datasets[part])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> Any:
        return self.mixture[self.start + i]
