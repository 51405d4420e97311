"""The identity of a LeRobot source: a digest of every file its examples come from.

Each file's sha256 is computed once and cached beside it (`file_digest`: reused while the
file's size and modification time are unchanged), so a changed table row or a replaced
video changes the identity, while a start-up on an unchanged dataset only stats its files.
The options that cut the files into examples (episodes, windows, normalisation, tolerance)
are part of it too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from embodichain_models.data.lerobot.dataset import LeRobotFrames


def source_files(dataset: LeRobotFrames) -> list[Path]:
    """The metadata files, and the data and video files of the selected episodes."""
    files = list(dataset.meta.meta_files)
    for episode in dataset.episodes:
        files.append(dataset.root / episode.data_file)
        files.extend(dataset.root / name for name, _ in episode.videos.values())
    return list(dict.fromkeys(files))


def dataset_identity(dataset: LeRobotFrames) -> str:
    """`lerobot-<version>:sha256=<digest of the files' digests and the options>`."""
    from embodichain.learning.sl import file_digest

    files = [(str(p.relative_to(dataset.root)), file_digest(p)) for p in source_files(dataset)]
    options: dict[str, Any] = {
        "episodes": [e.index for e in dataset.episodes],
        "delta_timestamps": dataset.delta_timestamps,
        "normalize": {k: mode for k, (mode, _, _) in dataset.normalize.items()},
        "tolerance_s": dataset.tolerance_s}
    text = json.dumps({"files": files, "options": options}, sort_keys=True)
    return (f"lerobot-{dataset.meta.version}:{len(dataset.episodes)} episodes:sha256="
            f"{hashlib.sha256(text.encode()).hexdigest()}")
