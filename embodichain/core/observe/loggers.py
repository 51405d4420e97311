"""Metric writers on rank 0 (R-OBS-2, R-OBS-3): metrics.jsonl always; TensorBoard, wandb
(observe/wandb_logger.py) and third-party loggers (entry-point group `embodichain.loggers`)
on request.

metrics.jsonl is the record of truth; TensorBoard event files in `RUN_DIR/tensorboard`
repeat every numeric value of every record under the same key and step. A run that
continues at update S opens a new event file with `purge_step=S+1`: TensorBoard then drops
whatever the earlier stream wrote beyond S (a rolled-back tail), so no step appears twice.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from embodichain.core.errors import UsageError
from embodichain.core.observe.other_loggers import check_other_loggers, open_other_loggers
from embodichain.core.runs.run_dir import METRICS, MetricsWriter

TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_HINT = "pip install 'embodichain[tensorboard]'"


def check_loggers(loggers: Sequence[str]) -> None:
    """Refuse (exit 2) before training when a requested logger's package is missing."""
    check_other_loggers(loggers)
    if "tensorboard" not in loggers:
        return
    problem = None
    if importlib.util.find_spec("tensorboard") is None:
        problem = "the tensorboard package is not installed"
    else:
        try:
            import torch.utils.tensorboard  # noqa: F401 - raises if tensorboard is unusable
        except ImportError as exc:
            problem = f"torch.utils.tensorboard does not import ({exc})"
    if problem:
        raise UsageError(f"trainer.loggers asks for tensorboard, but {problem}; install it "
                         f"with: {TENSORBOARD_HINT} (or remove tensorboard from "
                         "trainer.loggers). Nothing was started.")


class LoggingMetricsWriter(MetricsWriter):
    """metrics.jsonl plus the other loggers a recipe names, written record by record."""

    def __init__(self, directory: Path, loggers: Sequence[str] = ("jsonl",),
                 start_step: int | None = None, identity: Mapping[str, Any] | None = None
                 ) -> None:
        super().__init__(Path(directory) / METRICS)
        self._tensorboard: Any = None
        # wandb and third-party loggers (R-OBS-3); `identity` is the run's (run id, config).
        self._others = open_other_loggers(Path(directory), loggers, identity or {}, start_step)
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            # A continued run (start_step S) purges the earlier stream's steps beyond S.
            purge = start_step + 1 if start_step is not None else None
            self._tensorboard = SummaryWriter(log_dir=str(Path(directory) / TENSORBOARD_DIR),
                                              purge_step=purge)

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)  # the record first: it must never miss a line
        if self._tensorboard is not None:
            step = record["step"]
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float) \
                        and not isinstance(value, bool):
                    self._tensorboard.add_scalar(key, value, global_step=step)
        for other in self._others:
            other.write(record)

    def sync(self) -> None:
        super().sync()
        if self._tensorboard is not None:
            self._tensorboard.flush()
        for other in self._others:
            other.sync()

    def close(self) -> None:
        super().close()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        others, self._others = self._others, []
        for other in others:
            other.close()
