"""The ways a LeRobot dataset is refused, and a table cache without room."""

from __future__ import annotations

from embodichain.core.errors import DataFormatError, UsageError


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


class CacheSpaceError(UsageError):
    """The node's table cache has no room for a selection's columns (found before they are
    copied, or when the disk fills while copying): names the cache directory, the bytes
    needed and how to point the cache elsewhere. Exit 2: a restart would meet the same full
    disk, so `--max-restarts` does not retry it."""
