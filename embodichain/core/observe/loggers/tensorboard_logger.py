"""`trainer.loggers: [..., tensorboard]` (R-OBS-2): TensorBoard event files on rank 0.

Event files in `RUN_DIR/tensorboard` repeat every numeric value of every record under the
same key and step. A run that continues at update S opens a new event file with
`purge_step=S+1`: TensorBoard then drops whatever the earlier stream wrote beyond S (a
rolled-back tail), so no step appears twice. Needs the extra `tensorboard`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"
TENSORBOARD_HINT = "pip install 'embodichain-sl[tensorboard]'"


def tensorboard_problem() -> str | None:
    """Why TensorBoard cannot be used here, or None."""
    if importlib.util.find_spec("tensorboard") is None:
        return "the tensorboard package is not installed"
    try:
        import torch.utils.tensorboard  # noqa: F401 - raises if tensorboard is unusable
    except ImportError as exc:
        return f"torch.utils.tensorboard does not import ({exc})"
    return None


class TensorBoardLogger:
    """Writes every numeric value of every record as a scalar."""

    def __init__(self, directory: Path, start_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A continued run (start_step S) purges the earlier stream's steps beyond S.
        purge = start_step + 1 if start_step is not None else None
        self._writer = SummaryWriter(log_dir=str(Path(directory) / TENSORBOARD_DIR),
                                     purge_step=purge)

    def write(self, record: Mapping[str, Any]) -> None:
        step = record["step"]
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, global_step=step)

    def video(self, tag: str, path: Path, mp4: bytes, fps: int, step: int) -> None:
        """An evaluation's film as an animated GIF (what TensorBoard plays), encoded with
        PyAV (torch's add_video would need moviepy)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        from embodichain.core.evaluation.video import gif

        data, height, width = gif(mp4, fps)
        image = Summary.Image(height=height, width=width, colorspace=3,
                              encoded_image_string=data)
        self._writer._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag=tag, image=image)]), step)

    def sync(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
