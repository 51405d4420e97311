"""`check-data` (R-SCALE-2): every training example loaded once before a long run, each bad
one reported with the reader's message, grouped when one bad frame fails several examples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

from embodichain.core.data.check_data import check_examples
from tests.models.lerobot.helpers import WRIST, spoil_images
from tests.support import run_cli
from tests.support.data import data_env, data_recipe


class _Flaky:
    """Ten examples; 3, 4 and 5 share one bad frame, 8 has its own problem."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index in (3, 4, 5):
            raise ValueError("frame 9 of episode 1 does not decode")
        if index == 8:
            raise OSError("file-002.mp4 is cut short")
        return index


def test_every_failure_is_kept_once_per_message_with_its_examples_at_any_worker_count(
        ) -> None:
    """Catches a check that stops at the first failure, repeats a shared bad frame once per
    example, or loses failures found in a data worker: the same two problems, with their
    examples, with 0 and 2 workers."""
    for workers in (0, 2):
        report = check_examples(_Flaky(), workers=workers)
        assert report.checked == 10 and report.failed == 4
        assert [(p.message, p.examples) for p in report.problems] == [
            ("ValueError: frame 9 of episode 1 does not decode", [3, 4, 5]),
            ("OSError: file-002.mp4 is cut short", [8])]


def test_a_lerobot_image_that_does_not_decode_is_named_by_episode_frame_and_file(
        tmp_path: Path) -> None:
    """Catches a check that does not decode what the source selects (the damaged camera is
    selected here): every frame of WRIST is junk, and each is reported with its episode,
    frame and file."""
    rng = np.random.default_rng(0)
    episodes = [EpisodeData("task", {"action": rng.standard_normal((n, 2)).astype(np.float32),
                                     WRIST: rng.integers(0, 256, (n, 4, 4, 3), np.uint8)})
                for n in (3, 2)]
    root = write_dataset(tmp_path / "data", episodes, {"action": feature("float32", (2,)),
                                                       WRIST: feature("image", (4, 4, 3))},
                         10, episodes_per_file=2)
    spoil_images(root / "data/chunk-000/file-000.parquet", WRIST)
    report = check_examples(LeRobotFrames(root, features=[WRIST]))
    assert report.failed == 5 and len(report.problems) == 5
    assert "episode 1, frame 1" in report.problems[-1].message
    assert "file-000.parquet" in report.problems[-1].message


def test_check_data_lists_the_bad_examples_and_exits_one(tmp_path: Path) -> None:
    """Catches a command that exits 0 over bad data or names no example: the recipe's
    example 77 raises, and check-data (with 2 data workers) exits 1 naming it and its
    message; the same recipe without the fault exits 0, and nothing is written."""
    recipe = data_recipe(tmp_path / "r.yaml", tmp_path / "run",
                         **{"trainer.data_workers": 2, "data.train_size": 200})
    bad = run_cli("check-data", str(recipe), "--no-progress",
                  env=data_env(EMBODICHAIN_TEST_FAIL_INDEX="77"))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "1 of 200 training examples do not load" in bad.stderr
    assert "corrupt record 77 (test)" in bad.stderr and "examples 77" in bad.stderr
    good = run_cli("check-data", str(recipe), "--no-progress", "--workers", "0",
                   env=data_env())
    assert good.returncode == 0, good.stderr
    assert "all 200 training examples load" in good.stderr
    assert not (tmp_path / "run").exists()


def test_frame_damage_is_listed_once_per_file_and_episode(tmp_path: Path) -> None:
    """A damaged camera fails every frame of both episodes: the report check-data prints has
    one line per file and episode, listing the frames (rough edge of issue 40). Catches one
    line per frame (a long damaged episode buries the report) and frames of two episodes
    folded together."""
    from embodichain.core.data.check_data import by_file_and_episode

    rng = np.random.default_rng(0)
    episodes = [EpisodeData("task", {"action": rng.standard_normal((n, 2)).astype(np.float32),
                                     WRIST: rng.integers(0, 256, (n, 4, 4, 3), np.uint8)})
                for n in (3, 2)]
    root = write_dataset(tmp_path / "data", episodes, {"action": feature("float32", (2,)),
                                                       WRIST: feature("image", (4, 4, 3))},
                         10, episodes_per_file=2)
    spoil_images(root / "data/chunk-000/file-000.parquet", WRIST)
    report = check_examples(LeRobotFrames(root, features=[WRIST]))
    grouped = by_file_and_episode(report.problems)
    assert len(grouped) == 2, [p.message for p in grouped]
    assert "episode 0, frames 0, 1, 2 (3 frames)" in grouped[0].message
    assert "episode 1, frames 0, 1 (2 frames)" in grouped[1].message
    assert all("file-000.parquet" in p.message for p in grouped)
    assert [p.examples for p in grouped] == [[0, 1, 2], [3, 4]]
    one = by_file_and_episode(report.problems[:1])
    assert one[0].message == report.problems[0].message  # a single frame: as the reader said
