"""Hashing a LeRobot dataset's files for its identity (minutes on a large dataset, the
first time: what `check-data`, `validate-config --build` and `train-sl` do while they open
the data) shows its progress in bytes where the command allows it (R-UX-1), and nothing
under `--no-progress`; the identity is the same either way.

Catches: the hashing silent however long it takes, a progress that counts other bytes than
the files hashed (it must end at their total), and one shown despite --no-progress."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.identity import dataset_identity, source_files
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

from embodichain.core.observe import work_progress
from embodichain.core.observe.work_progress import _amount, showing_progress


def test_hashing_the_data_shows_its_bytes_only_where_allowed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    episodes = [EpisodeData(task="t", values={
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32)}) for n in (4, 5)]
    root = write_dataset(tmp_path / "d", episodes, {"observation.state": feature("float32", (3,)),
                                                    "action": feature("float32", (2,))}, 10)
    frames = LeRobotFrames(root)
    monkeypatch.setattr(work_progress, "HOLD_BACK_S", 0.0)
    monkeypatch.delenv("RANK", raising=False)
    with showing_progress(False):
        quiet = dataset_identity(frames)
    assert capsys.readouterr().err == ""
    with showing_progress(True):
        shown = dataset_identity(frames)
    assert shown == quiet
    files = source_files(frames)
    total = sum(p.stat().st_size for p in files)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"hashing {len(files)} data files: {_amount(total, 'B')} of "
                           f"{_amount(total, 'B')}  "), last
