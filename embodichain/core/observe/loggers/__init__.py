"""Metric loggers on rank 0 (R-OBS-2, R-OBS-3): metrics.jsonl always, the record of truth;
TensorBoard (`tensorboard_logger`), wandb (`wandb_logger`) and third-party loggers on
request. Every logger is a `MetricLogger`; `LoggingMetricsWriter` writes metrics.jsonl and
hands each record to the others.

A third-party logger is registered under the entry-point group `embodichain.loggers`; the
entry point names a callable `make(directory, identity, start_step)` returning a
`MetricLogger`. `record` is one metrics.jsonl line (`step` plus flat keys), `identity` the
run's (run id, config, ...), `start_step` the update a continued run resumes at (None for a
fresh one).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from embodichain.core.errors import UsageError
from embodichain.core.recipe.logger_names import LOGGER_GROUP, registered_loggers
from embodichain.core.runs.run_dir import METRICS, MetricsWriter


class MetricLogger(Protocol):
    """What a logger does with the records (see the package docstring)."""

    def write(self, record: Mapping[str, Any]) -> None: ...

    def sync(self) -> None: ...

    def close(self) -> None: ...


class VideoLogger(Protocol):
    """A logger that also shows videos (optional): `video(tag, path, mp4, fps, step)`, the
    film of an evaluation's episode (R-EVAL-1), as a file and as its bytes."""

    def video(self, tag: str, path: Path, mp4: bytes, fps: int, step: int) -> None: ...


def _wanted(loggers: Sequence[str]) -> list[str]:
    return [name for name in dict.fromkeys(loggers) if name != "jsonl"]


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse (exit 2) before training a logger that cannot be used: its package not
    installed, a third-party entry point that is gone or does not import."""
    from embodichain.core.observe.loggers.tensorboard_logger import (
        TENSORBOARD_HINT,
        tensorboard_problem,
    )
    from embodichain.core.observe.loggers.wandb_logger import WANDB_HINT

    for name in _wanted(loggers):
        if name == "tensorboard":
            if problem := tensorboard_problem():
                raise UsageError(f"trainer.loggers asks for tensorboard, but {problem}; "
                                 f"install it with: {TENSORBOARD_HINT} (or remove tensorboard "
                                 "from trainer.loggers). Nothing was started.")
        elif name == "wandb":
            if importlib.util.find_spec("wandb") is None:
                raise UsageError("trainer.loggers asks for wandb, but the wandb package is not "
                                 f"installed; install it with: {WANDB_HINT} (or remove wandb "
                                 "from trainer.loggers). Nothing was started.")
        else:
            entry = registered_loggers().get(name)
            if entry is None:
                raise UsageError(f"trainer.loggers: no logger {name!r} is registered under "
                                 f"the entry-point group {LOGGER_GROUP}. Nothing was started.")
            try:
                entry.load()
            except Exception as exc:
                raise UsageError(f"trainer.loggers: logger {name!r} ({entry.value}) does not "
                                 f"import: {type(exc).__name__}: {exc}. Nothing was "
                                 "started.") from None


def open_loggers(directory: Path, loggers: Sequence[str], identity: Mapping[str, Any],
                 start_step: int | None) -> list[MetricLogger]:
    """Start the requested loggers other than metrics.jsonl for the run in `directory`."""
    opened: list[MetricLogger] = []
    for name in _wanted(loggers):
        if name == "tensorboard":
            from embodichain.core.observe.loggers.tensorboard_logger import TensorBoardLogger

            opened.append(TensorBoardLogger(directory, start_step))
        elif name == "wandb":
            from embodichain.core.observe.loggers.wandb_logger import WandbLogger

            opened.append(WandbLogger(directory, identity))
        else:
            make = registered_loggers()[name].load()
            opened.append(make(directory=directory, identity=identity, start_step=start_step))
    return opened


class LoggingMetricsWriter(MetricsWriter):
    """metrics.jsonl plus the other loggers a recipe names, written record by record."""

    def __init__(self, directory: Path, loggers: Sequence[str] = ("jsonl",),
                 start_step: int | None = None, identity: Mapping[str, Any] | None = None
                 ) -> None:
        super().__init__(Path(directory) / METRICS)
        self._loggers = open_loggers(Path(directory), loggers, identity or {}, start_step)

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)  # the record first: it must never miss a line
        for logger in self._loggers:
            logger.write(record)

    def write_videos(self, step: int, films: Mapping[str, tuple[Path, bytes]], fps: int
                     ) -> None:
        """Hand the films of an evaluation (`{tag: (mp4 path, its bytes)}`) to every logger
        that shows videos; a logger that fails is warned about, never fails the run."""
        import logging

        for logger in self._loggers:
            show = getattr(logger, "video", None)
            if show is None:
                continue
            for tag, (path, data) in films.items():
                try:
                    show(tag, path, data, fps, step)
                except Exception as exc:
                    logging.getLogger("embodichain").warning(
                        "warning: %s could not show the video %s: %s: %s",
                        type(logger).__name__, path, type(exc).__name__, exc)

    def sync(self) -> None:
        super().sync()
        for logger in self._loggers:
            logger.sync()

    def close(self) -> None:
        super().close()
        loggers, self._loggers = self._loggers, []
        for logger in loggers:
            logger.close()
