"""The two ways a LeRobot dataset is refused."""

from __future__ import annotations


class LeRobotFormatError(ValueError):
    """The dataset on disk is not one this reader can use (found when it is opened): a
    missing or unknown-version `meta/info.json`, a corrupt parquet file, a table that
    disagrees with its metadata, a video shorter than its table, an unknown feature."""


class LeRobotDecodeError(RuntimeError):
    """An example could not be loaded (found in `__getitem__`): names the episode, the frame
    and the file."""
