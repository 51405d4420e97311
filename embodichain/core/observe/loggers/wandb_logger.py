"""`trainer.loggers: [..., wandb]` (R-OBS-3): Weights & Biases on rank 0, online or offline.

The wandb run id is the embodichain run id, kept in run.json (`wandb: {id, project}`), so
every continuation of a run (resume, `--resume auto`, torchrun's restarts) logs into the
same wandb run. wandb's steps must only increase: a continued run skips the records up to
the last step an earlier process sent (read from `wandb.steps` beside metrics.jsonl, one
line per step sent), which after an exact resume are the same figures again. Settings come
from wandb's own environment (`WANDB_MODE=offline`, `WANDB_PROJECT`, `WANDB_ENTITY`);
files go to `WANDB_DIR`, else to the run directory. Needs the extra `wandb`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodichain.core.runs.run_dir import read_run_json, update_run_json

WANDB_HINT = "pip install 'embodichain-sl[wandb]'"
STEPS_FILE = "wandb.steps"
DEFAULT_PROJECT = "embodichain"


def last_sent_step(directory: Path) -> int | None:
    """The newest step an earlier process of this run sent to wandb (None: none)."""
    try:
        lines = (Path(directory) / STEPS_FILE).read_text().split()
    except OSError:
        return None
    for text in reversed(lines):  # a torn last line (a kill mid-write) is skipped
        if text.isdigit():
            return int(text)
    return None


class WandbLogger:
    """Sends every numeric value of every record, under its own key and step."""

    def __init__(self, directory: Path, identity: Mapping[str, Any]) -> None:
        import wandb

        self.directory = Path(directory)
        saved = (read_run_json(self.directory) or {}).get("wandb") or {}
        run_id = str(saved.get("id") or identity["run_id"])
        project = os.environ.get("WANDB_PROJECT") or saved.get("project") or DEFAULT_PROJECT
        root = Path(os.environ.get("WANDB_DIR") or self.directory)
        root.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(id=run_id, project=project, resume="allow", dir=str(root),
                              name=self.directory.name, config=dict(identity.get("config") or {}))
        if not saved:
            update_run_json(self.directory, lambda data: data.setdefault(
                "wandb", {"id": run_id, "project": project}))
        # Online, wandb knows the resumed run's next step; offline only our own record does.
        floors = [s for s in (last_sent_step(self.directory),
                              (self.run.step - 1) if self.run.step else None) if s is not None]
        self.floor = max(floors) if floors else None
        self._steps = open(self.directory / STEPS_FILE, "a")  # noqa: SIM115 - closed in close()
        self._last: int | None = None

    def write(self, record: Mapping[str, Any]) -> None:
        step = record["step"]
        if self.floor is not None and step <= self.floor:
            return  # an earlier process sent this step (the same figures, R-RESUME-1)
        values = {k: v for k, v in record.items() if k != "step"
                  and isinstance(v, int | float) and not isinstance(v, bool)}
        if values:
            self.run.log(values, step=step)
            if step != self._last:
                self._steps.write(f"{step}\n")
                self._steps.flush()
                self._last = step

    def video(self, tag: str, path: Path, mp4: bytes, fps: int, step: int) -> None:
        """An evaluation's film (the mp4 file under the run directory)."""
        import wandb

        if self.floor is not None and step <= self.floor:
            return  # an earlier process sent this step
        self.run.log({tag: wandb.Video(str(path), format="mp4")}, step=step)

    def sync(self) -> None:
        self._steps.flush()

    def close(self) -> None:
        self._steps.close()
        self.run.finish()
