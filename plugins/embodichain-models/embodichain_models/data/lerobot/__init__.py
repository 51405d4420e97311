"""LeRobot datasets (format v3.0 and v2.1) as training sources, read with pyarrow and PyAV
(`pip install 'embodichain-models[lerobot]'`), without the `lerobot` package.

    from embodichain_models.data.lerobot import lerobot_source
    source = lerobot_source("data/my_dataset", delta_timestamps={"action": [0, 1/30]})
    mixed = lerobot_mixture([("data/sim", 3), (lerobot_source("data/real", rename={
        "observation.images.top": "observation.image"}), 1)], normalize={"action": "mean_std"})

Everything here imports pyarrow, PyAV and torch on first use only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from embodichain_models.data.lerobot.errors import LeRobotDecodeError, LeRobotFormatError

if TYPE_CHECKING:
    from embodichain.learning.sl import DatasetSource
    from embodichain_models.data.lerobot.dataset import LeRobotFrames

__all__ = ["LeRobotDecodeError", "LeRobotFormatError", "LeRobotFrames", "lerobot_mixture",
           "lerobot_source"]


def lerobot_source(root: str | Path, *, identity: str = "content",
                   rename: Mapping[str, str] | None = None, **options: Any) -> DatasetSource:
    """A `DatasetSource` over the LeRobot dataset at `root`; `options` are those of
    `LeRobotFrames` (delta_timestamps, episodes, tolerance_s, normalize). Its identity is
    the digest of every byte the selected episodes read (`identity="content"`), or of their
    metadata, table footers and video headers only (`identity="metadata"`, for datasets too
    large to hash); see `identity.py`. `rename={their_key: our_key}` gives features other
    names (examples, statistics, and the keys of the options, which use ours); see
    `renamed.py`."""
    from embodichain.learning.sl import DatasetSource
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.data.lerobot.identity import IDENTITY_MODES, dataset_identity

    if identity not in IDENTITY_MODES:  # before opening anything
        raise LeRobotFormatError(f"identity={identity!r} is not one of "
                                 f"{', '.join(IDENTITY_MODES)}")
    if rename:
        from embodichain_models.data.lerobot.renamed import (
            RenamedFrames,
            check_rename,
            reader_options,
        )

        rename = check_rename(root, rename)
        frames = LeRobotFrames(root, **reader_options(rename, options))
        names = json.dumps(rename, sort_keys=True)
        return DatasetSource(RenamedFrames(frames, rename),
                             identity=f"{dataset_identity(frames, identity)}:rename={names}")
    dataset = LeRobotFrames(root, **options)
    return DatasetSource(dataset, identity=dataset_identity(dataset, identity))


def lerobot_mixture(parts: Sequence[tuple[str | Path | DatasetSource, float]], *,
                    names: Sequence[str] | None = None, normalization: str = "per_part",
                    identity: str = "content", **options: Any) -> DatasetSource:
    """Several LeRobot datasets as one source, sampled by weight: `parts` are `(root, weight)`
    (opened with `options`, those of `lerobot_source`) or `(lerobot_source(root, rename=...,
    episodes=...), weight)` (a source carries its own options). The probability that an
    example comes from part i is w_i / Σw (with replacement; see `embodichain.core.data.
    mixture` for `sampling: epochs`). `names` name the parts (default: their directories)
    in metrics (`train/examples/<name>`). `normalization="per_part"`: `normalize=` uses each
    part's own `meta/stats.json`; `"pooled"`: the parts' statistics pooled, weighted by
    their counts. Its identity is its parts' identities, weights and these options. A part
    that would not batch with the others is refused by name (see `mixture.py`)."""
    from embodichain.core.data.mixture import MixtureSource, Parts
    from embodichain.learning.sl import DatasetSource
    from embodichain_models.data.lerobot.mixture import (
        NORMALIZATIONS,
        MixtureFrames,
        check_batchable,
        check_weight,
        part_names,
        pooled_normalization,
        refuse_double_normalization,
    )

    if normalization not in NORMALIZATIONS:
        raise LeRobotFormatError(f"normalization={normalization!r} is not one of "
                                 f"{', '.join(NORMALIZATIONS)}")
    parts = list(parts)
    if not parts:
        raise LeRobotFormatError("a mixture needs at least one part")
    labels = part_names([what for what, _ in parts], names)
    if len(set(labels)) != len(labels):
        raise LeRobotFormatError(f"mixture part names must differ: {labels}")
    pooled = options.pop("normalize", None) if normalization == "pooled" else None
    sources, weights = [], []
    for name, (what, weight) in zip(labels, parts, strict=True):
        weights.append(check_weight(name, weight))
        try:
            if isinstance(what, DatasetSource):
                if normalization == "pooled":
                    refuse_double_normalization(name, what.dataset)
                source = what
            else:
                source = lerobot_source(what, identity=identity, **options)
        except LeRobotFormatError as exc:
            where = "" if isinstance(what, DatasetSource) else f" ({what})"
            raise LeRobotFormatError(f"mixture part {name!r}{where}: {exc}") from None
        sources.append(source)
    datasets = [s.dataset for s in sources]
    check_batchable(labels, datasets)
    normalize = pooled_normalization(labels, datasets, pooled or {})
    document = {"parts": [{"name": n, "identity": s.identity, "weight": w}
                          for n, s, w in zip(labels, sources, weights, strict=True)],
                "normalization": normalization,
                "normalize": {k: mode for k, (mode, _, _) in normalize.items()}}
    digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    return MixtureSource(MixtureFrames(labels, datasets, normalize),
                         identity=f"lerobot-mixture:{len(labels)} parts:sha256={digest}",
                         parts=Parts(tuple(labels), tuple(len(d) for d in datasets),
                                     tuple(weights)))


def __getattr__(name: str) -> Any:
    if name == "LeRobotFrames":
        from embodichain_models.data.lerobot.dataset import LeRobotFrames

        return LeRobotFrames
    raise AttributeError(name)
