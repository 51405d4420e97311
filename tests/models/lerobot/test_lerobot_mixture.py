"""`lerobot_mixture` (R-SCALE-3): two small datasets of different fps and key names (A at 30
fps, B at 15 fps under other names, renamed), their examples, normalisation, refusals and
identity. The sampling by weight is tested in tests/core/data/test_mixture.py and, through
training runs, in test_lerobot_mixture_runs.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from embodichain_models.data.lerobot import LeRobotFormatError, lerobot_mixture, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames

from tests.models.lerobot.helpers import MIXTURE_RENAME, mixture_parts

WINDOW = {"action": [0.0, 2 / 30]}  # 2 frames at A's 30 fps, 1 at B's 15


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return mixture_parts(tmp_path_factory.mktemp("mix"))


def _mixture(parts: tuple[Path, Path], weights: tuple[float, float] = (3, 1), **options):
    a, b = parts
    own = {k: v for k, v in options.items() if k != "normalization"}
    if options.get("normalization") == "pooled":
        own.pop("normalize", None)
    b_source = lerobot_source(b, rename=MIXTURE_RENAME, **own)
    return lerobot_mixture([(a, weights[0]), (b_source, weights[1])], names=["a", "b"],
                           **options)


def _raw(root: Path, key: str) -> np.ndarray:
    return LeRobotFrames(root).tables.columns[key]


def test_examples_come_from_their_part_with_windows_at_its_own_fps(parts) -> None:
    """Catches a window converted at one fps for all parts (B's 2/30 s would be 2 frames,
    not 1), a rename that misses `<key>_is_pad` or a value, and episode/task indices left
    as each part's own (B's episode 0 would collide with A's, and B's task 0 is "place",
    not A's task 0 "pick"); each example says its part."""
    a, b = parts
    source = _mixture(parts, delta_timestamps=WINDOW)
    frames = source.dataset
    assert len(source) == 63 + 26 and source.parts.sizes == (63, 26)
    assert frames.tasks == ["pick", "place"]
    assert frames.episodes == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    a_action, b_action = _raw(a, "action"), _raw(b, "act")
    first = frames[0]  # A's episode 0, frame 0
    assert first["part_index"].item() == 0 and first["episode_index"].item() == 0
    assert torch.equal(first["action"], torch.from_numpy(a_action[[0, 2]]))
    b0 = frames[63]  # B's episode 0, frame 0: "place"
    assert b0["part_index"].item() == 1 and b0["episode_index"].item() == 3
    assert b0["task_index"].item() == 1
    assert torch.equal(b0["action"], torch.from_numpy(b_action[[0, 1]]))
    assert torch.equal(b0["observation.state"], torch.from_numpy(_raw(b, "state")[0]))
    b1 = frames[63 + 12]  # B's episode 1: "pick", mixture-wide task 0
    assert b1["episode_index"].item() == 4 and b1["task_index"].item() == 0
    last = frames[63 + 11]  # B's episode 0's last frame: its next one is padding
    assert last["action_is_pad"].tolist() == [False, True]
    assert set(first) == set(b0) and "cam" not in b0 and "act_is_pad" not in b0


def test_per_part_and_pooled_normalisation_match_hand_computed_values(parts) -> None:
    """Catches pooled statistics that average the parts' means unweighted (A has 63 rows,
    B 26) or pool the variances without the spread of the means, and a per-part mixture
    that normalises B by A's statistics: against mean/std computed here from the rows."""
    a, b = parts
    a_action, b_action = _raw(a, "action"), _raw(b, "act")
    options = {"normalize": {"action": "mean_std"}}
    per_part = _mixture(parts, **options).dataset
    for position, raw, rows in ((5, a_action, a_action), (63 + 3, b_action, b_action)):
        expected = (raw[position % 63] - rows.mean(0)) / rows.std(0)
        assert torch.allclose(per_part[position]["action"],
                              torch.from_numpy(expected.astype(np.float32)), atol=1e-5)
    pooled = _mixture(parts, normalization="pooled", **options).dataset
    every = np.concatenate([a_action, b_action]).astype(np.float64)
    for position, raw in ((5, a_action), (63 + 3, b_action)):
        expected = (raw[position % 63] - every.mean(0)) / every.std(0)
        assert torch.allclose(pooled[position]["action"],
                              torch.from_numpy(expected.astype(np.float32)), atol=1e-5)


def test_a_key_one_part_lacks_is_refused_by_name(parts) -> None:
    """Catches a mixture that opens parts with different keys (the first batch mixing them
    would fail in a worker, or silently drop the key): B without its renaming lacks
    `observation.state`, and the message names the key and both parts."""
    a, b = parts
    with pytest.raises(LeRobotFormatError,
                       match=r"part 'b' \(.*b\) has no 'observation.state', which part "
                             r"'a' \(.*a\)"):
        lerobot_mixture([(a, 3), (b, 1)], names=["a", "b"])


@pytest.mark.parametrize(("change", "key"), [({"b_action": 3}, "action"),
                                             ({"b_image": 16}, "observation.images.top")])
def test_parts_that_would_not_batch_are_refused_by_name(change: dict, key: str,
                                                        tmp_path: Path) -> None:
    """Catches a mixture that checks key names only: B's actions of 3 numbers (A's are 2),
    or B's 16x16 camera (A's is 8x8), are refused when opened, naming the key, both parts
    and their shapes; a LeRobotFormatError, so exit 2 from a factory."""
    a, b = mixture_parts(tmp_path, **change)
    with pytest.raises(LeRobotFormatError,
                       match=rf"'a' \(.*a\) and 'b' \(.*b\) would not batch: '{key}' is "
                             r"float32 \["):
        lerobot_mixture([(a, 3), (lerobot_source(b, rename=MIXTURE_RENAME), 1)],
                        names=["a", "b"])


def test_parts_whose_dtypes_differ_are_refused_naming_the_key_and_both_dtypes(
        tmp_path: Path) -> None:
    """Catches a mixture that compares shapes only: B's actions stored as float64 (A's are
    float32) have the same shape, and the run would die at the first batch mixing them; the
    mixture is refused when opened, naming the key, both parts and both dtypes, as a
    LeRobotFormatError (a DataFormatError: exit 2 from a factory)."""
    a, b = mixture_parts(tmp_path, b_action_dtype="float64")
    with pytest.raises(LeRobotFormatError,
                       match=r"'a' \(.*a\) and 'b' \(.*b\) would not batch: 'action' is "
                             r"float32 \[2\] in 'a' and float64 \[2\] in 'b'"):
        lerobot_mixture([(a, 3), (lerobot_source(b, rename=MIXTURE_RENAME), 1)],
                        names=["a", "b"])


def test_a_window_that_is_not_whole_frames_at_a_parts_fps_is_refused_naming_it(
        parts, tmp_path: Path) -> None:
    """Catches windows converted by the first part's fps only: 1/30 s is a whole frame at
    A's 30 fps but half of one at B's 15, so B is refused naming the part, its root, the key
    and its fps. (B's state is named as A's here: before issue 40 this test used B as it is,
    which lacks the key, and passed on that refusal instead of the fps one.)"""
    a, b = mixture_parts(tmp_path, b_state_key="observation.state")
    with pytest.raises(LeRobotFormatError, match=r"mixture part 'b' \(.*b\): delta_timestamps"
                       r"\['observation.state'\]: .* at the fps of the dataset at .*\(fps 15"):
        lerobot_mixture([(a, 3), (b, 1)], names=["a", "b"],
                        delta_timestamps={"observation.state": [0, 1 / 30]})
    a, b = parts
    with pytest.raises(LeRobotFormatError, match=r"mixture part 'b': weight -1"):
        lerobot_mixture([(a, 3), (b, -1)], names=["a", "b"])


def test_the_identity_is_the_parts_the_weights_and_the_options(parts) -> None:
    """Catches an identity that leaves out the weights or the normalisation (a resume with
    the parts mixed otherwise would be accepted), or depends on anything else."""
    same = _mixture(parts).identity
    assert same.startswith("lerobot-mixture:2 parts:") and _mixture(parts).identity == same
    assert _mixture(parts, weights=(1, 1)).identity != same
    assert _mixture(parts, normalization="pooled",
                    normalize={"action": "mean_std"}).identity != \
        _mixture(parts, normalize={"action": "mean_std"}).identity
