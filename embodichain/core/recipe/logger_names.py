"""The names `trainer.loggers` accepts (R-OBS-2, R-OBS-3): the built-in writers and those
that third-party packages register under the entry-point group `embodichain.loggers`.

Reads entry-point metadata only (nothing is imported), so recipe checks stay torch-free.
"""

from __future__ import annotations

import importlib_metadata

from embodichain.core.errors import did_you_mean

LOGGER_GROUP = "embodichain.loggers"
BUILTIN_LOGGERS = ("jsonl", "tensorboard", "wandb")


def registered_loggers() -> dict[str, importlib_metadata.EntryPoint]:
    """Third-party loggers by name (a built-in name cannot be taken over)."""
    return {ep.name: ep for ep in importlib_metadata.entry_points(group=LOGGER_GROUP)
            if ep.name not in BUILTIN_LOGGERS}


def check_logger_name(name: str) -> str:
    """`name` when it is a known logger; otherwise a ValueError listing the known ones."""
    known = [*BUILTIN_LOGGERS, *sorted(registered_loggers())]
    if name not in known:
        raise ValueError(f"unknown logger {name!r}; {did_you_mean(name, known)}known: "
                         f"{', '.join(known)} (third-party loggers register under the "
                         f"entry-point group {LOGGER_GROUP})")
    return name
