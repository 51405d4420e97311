"""Loggers beside metrics.jsonl and TensorBoard (R-OBS-3): wandb, and third-party ones.

A third-party logger is registered under the entry-point group `embodichain.loggers`; the
entry point names a callable `make(directory, identity, start_step)` returning an object
with `write(record)`, `sync()` and `close()`. `record` is one metrics.jsonl line (`step`
plus flat keys), `identity` the run's (run id, config, ...), `start_step` the update a
continued run resumes at (None for a fresh one). Rank 0 only, like every logger.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from embodichain.core.errors import UsageError
from embodichain.core.recipe.logger_names import LOGGER_GROUP, registered_loggers


class MetricLogger(Protocol):
    """What a logger does with the records (see the module docstring)."""

    def write(self, record: Mapping[str, Any]) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


def _wanted(loggers: Sequence[str]) -> list[str]:
    return [name for name in dict.fromkeys(loggers) if name not in ("jsonl", "tensorboard")]


def check_other_loggers(loggers: Sequence[str]) -> None:
    """Refuse (exit 2) before training a logger that cannot be used: wandb not installed,
    a third-party entry point that is gone or does not import."""
    from embodichain.core.observe.wandb_logger import WANDB_HINT

    for name in _wanted(loggers):
        if name == "wandb":
            if importlib.util.find_spec("wandb") is None:
                raise UsageError("trainer.loggers asks for wandb, but the wandb package is not "
                                 f"installed; install it with: {WANDB_HINT} (or remove wandb "
                                 "from trainer.loggers). Nothing was started.")
            continue
        entry = registered_loggers().get(name)
        if entry is None:
            raise UsageError(f"trainer.loggers: no logger {name!r} is registered under the "
                             f"entry-point group {LOGGER_GROUP}. Nothing was started.")
        try:
            entry.load()
        except Exception as exc:
            raise UsageError(f"trainer.loggers: logger {name!r} ({entry.value}) does not "
                             f"import: {type(exc).__name__}: {exc}. Nothing was "
                             "started.") from None


def open_other_loggers(directory: Path, loggers: Sequence[str], identity: Mapping[str, Any],
                       start_step: int | None) -> list[MetricLogger]:
    """Start the requested loggers for the run in `directory` (rank 0)."""
    opened: list[MetricLogger] = []
    for name in _wanted(loggers):
        if name == "wandb":
            from embodichain.core.observe.wandb_logger import WandbLogger

            opened.append(WandbLogger(directory, identity))
        else:
            make = registered_loggers()[name].load()
            opened.append(make(directory=directory, identity=identity, start_step=start_step))
    return opened
