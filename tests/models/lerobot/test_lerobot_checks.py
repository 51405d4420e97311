"""What a LeRobot source checks when opened, and what a feature selection spares: a video
cut short is refused at once (not hours into the run), and a camera the recipe does not use
is neither read, decoded nor checked, so its damage cannot stop training."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from embodichain_models.data.lerobot import LeRobotFormatError
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

from tests.models.lerobot.helpers import (
    SIDE,
    WRIST,
    cartpole_with_unused_cameras,
    cut_tail,
    header_first,
    spoil_images,
)
from tests.support import run_cli, worker_env

FPS = 10
LENGTHS = (5, 9, 7)
VIDEO = "observation.images.top"


def _tiny(root: Path) -> Path:
    """Three episodes in one data file and one video file per camera: a state, an action,
    WRIST (PNG in the rows) and VIDEO."""
    rng = np.random.default_rng(3)
    episodes = [EpisodeData("task", {
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        WRIST: rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8),
        VIDEO: rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)}) for n in LENGTHS]
    spec = {"observation.state": feature("float32", (3,)), "action": feature("float32", (2,)),
            WRIST: feature("image", (4, 4, 3)), VIDEO: feature("video", (16, 16, 3))}
    return write_dataset(root, episodes, spec, FPS, episodes_per_file=3)


def test_a_video_cut_short_is_refused_at_open_naming_the_file_and_the_episode(
        tmp_path: Path) -> None:
    """Catches a check that trusts the container's header: with the header first, a video
    cut to 60% of its bytes still lists every frame, so a header-only check lets the run
    start and stop at the first example beyond the cut."""
    root = _tiny(tmp_path / "data")
    video = root / f"videos/{VIDEO}/chunk-000/file-000.mp4"
    header_first(video)
    assert len(LeRobotFrames(root)) == sum(LENGTHS)  # whole, it opens
    cut_tail(video)
    with pytest.raises(LeRobotFormatError) as caught:
        LeRobotFrames(root)
    message = str(caught.value)
    assert re.search(r"file-000\.mp4 is cut short: episode [12]'s last frame", message), message


def test_a_selection_neither_reads_nor_decodes_nor_checks_the_other_features(
        tmp_path: Path) -> None:
    """Catches `features=` applied to the example's keys but not to what is decoded (every
    example fails on WRIST's undecodable PNGs) or not to the start-up checks (the cut video
    refused), and a window over a feature the selection leaves out taken silently."""
    root = _tiny(tmp_path / "data")
    spoil_images(root / "data/chunk-000/file-000.parquet", WRIST)
    cut_tail(root / f"videos/{VIDEO}/chunk-000/file-000.mp4")
    dataset = LeRobotFrames(root, features=["observation.state", "action"],
                            delta_timestamps={"action": [0.0, 0.1]})
    examples = [dataset[i] for i in range(len(dataset))]
    assert not {WRIST, VIDEO} & set(examples[0])
    assert examples[3]["action"].shape == (2, 2) and torch.is_tensor(examples[3]["index"])
    with pytest.raises(LeRobotFormatError, match=rf"names '{WRIST}', which features= leaves"):
        LeRobotFrames(root, features=["action"], delta_timestamps={WRIST: [0.0]})
    with pytest.raises(LeRobotFormatError, match=r"features names 'actions', which the"):
        LeRobotFrames(root, features=["actions"])


def test_an_unused_camera_damaged_does_not_stop_the_cart_pole_recipe(tmp_path: Path) -> None:
    """Catches the recipe opening every feature of the dataset (its SIDE video, cut short,
    refused at start-up: exit 2) or decoding them all (WRIST's undecodable PNGs: exit 1
    at the first batch)."""
    data = cartpole_with_unused_cameras(tmp_path / "data")
    proc = run_cli("init", "cartpole_bc", str(tmp_path / "r.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    recipe = yaml.safe_load((tmp_path / "r.yaml").read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update({"batch_size": 8, "max_updates": 4, "save_every": 4,
                              "validate_every": 4, "log_every": 4, "data_workers": 0,
                              "output_dir": str(tmp_path / "run")})
    recipe["model"] = {"channels": 4, "hidden": 16}
    recipe["data"].update(root=str(data), val_episodes=1)
    recipe["validation"] = {"max_examples": 8}
    recipe["evaluation"].update(episodes=1, max_steps=20, envs_per_rank=1, videos=0)
    recipe["evaluation"]["env"]["kwargs"] = {"size": 32}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    proc: subprocess.CompletedProcess[str] = run_cli(
        "train-sl", "--config", str(tmp_path / "r.yaml"), "--no-progress", cwd=tmp_path,
        env=worker_env())
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "last.pt").is_file()
    assert SIDE not in proc.stderr and WRIST not in proc.stderr


def test_videos_are_checked_once_per_machine_and_again_when_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches every rank (and every start) opening every video again to check it, and a
    cached verdict outliving the file it judged: a second open reads the verdict (the
    check itself would fail here), a file cut short afterwards is checked again and
    refused, naming it."""
    from embodichain_models.data.lerobot import dataset as reader

    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    root = _tiny(tmp_path / "data")
    LeRobotFrames(root, features=[VIDEO])  # checks and records the verdict

    def checked_again(*args: object) -> None:
        raise AssertionError("the video was checked again")

    monkeypatch.setattr(reader, "video_length_s", checked_again)
    LeRobotFrames(root, features=[VIDEO])
    monkeypatch.undo()
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    video = next((root / "videos").rglob("*.mp4"))
    header_first(video)
    cut_tail(video)
    with pytest.raises(LeRobotFormatError, match=re.escape(video.name)):
        LeRobotFrames(root, features=[VIDEO])
