"""LeRobot datasets (format v3.0 and v2.1) as training sources, read with pyarrow and PyAV
(`pip install 'embodichain-models[lerobot]'`), without the `lerobot` package.

    from embodichain_models.data.lerobot import lerobot_source
    source = lerobot_source("data/my_dataset", delta_timestamps={"action": [0, 1/30]})

Everything here imports pyarrow, PyAV and torch on first use only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from embodichain_models.data.lerobot.errors import LeRobotDecodeError, LeRobotFormatError

if TYPE_CHECKING:
    from embodichain.learning.sl import DatasetSource
    from embodichain_models.data.lerobot.dataset import LeRobotFrames

__all__ = ["LeRobotDecodeError", "LeRobotFormatError", "LeRobotFrames", "lerobot_source"]


def lerobot_source(root: str | Path, *, identity: str = "content",
                   **options: Any) -> DatasetSource:
    """A `DatasetSource` over the LeRobot dataset at `root`; `options` are those of
    `LeRobotFrames` (delta_timestamps, episodes, tolerance_s, normalize). Its identity is
    the digest of every byte the selected episodes read (`identity="content"`), or of their
    metadata, table footers and video headers only (`identity="metadata"`, for datasets too
    large to hash); see `identity.py`."""
    from embodichain.learning.sl import DatasetSource
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.data.lerobot.identity import IDENTITY_MODES, dataset_identity

    if identity not in IDENTITY_MODES:  # before opening anything
        raise LeRobotFormatError(f"identity={identity!r} is not one of "
                                 f"{', '.join(IDENTITY_MODES)}")
    dataset = LeRobotFrames(root, **options)
    return DatasetSource(dataset, identity=dataset_identity(dataset, identity))


def __getattr__(name: str) -> Any:
    if name == "LeRobotFrames":
        from embodichain_models.data.lerobot.dataset import LeRobotFrames

        return LeRobotFrames
    raise AttributeError(name)
