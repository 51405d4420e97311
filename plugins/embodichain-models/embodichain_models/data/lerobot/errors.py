"""The two ways a LeRobot dataset is refused."""

from __future__ import annotations

from embodichain.core.errors import DataFormatError


class LeRobotFormatError(DataFormatError, ValueError):
    """The dataset on disk is not one this reader can use (found when it is opened): a
    missing or unknown-version `meta/info.json`, a corrupt parquet file, a table that
    disagrees with its metadata, a video shorter than its table, an unknown feature.

    A `DataFormatError`, so the CLI refuses with exit 2 (never retried under
    `--max-restarts`) whether a factory lets it through or wraps it in its own exception;
    still a ValueError for code that caught it as one."""


class LeRobotDecodeError(RuntimeError):
    """An example could not be loaded (found in `__getitem__`): names the episode, the frame
    and the file."""
