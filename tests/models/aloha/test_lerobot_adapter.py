"""benchmarks/lerobot_adapter.py (R-TRUST-4): the normalisation that lets a lerobot-trained
ACT act in our environment, checked on a tiny dataset against hand-computed values, without
lerobot installed (the benchmark checks it against lerobot's own preprocessor)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

from tests.support.processes import REPO

CAMERA = "observation.images.top"
KEYS = ["observation.state", "action", CAMERA]


def adapter_module():
    path = REPO / "benchmarks" / "lerobot_adapter.py"
    spec = importlib.util.spec_from_file_location("_embodichain_test_lerobot_adapter", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """2 episodes of 2 frames: state (x, 0.5) with x = 0, 2 | 4, 6 (the second joint
    constant), action = 10 x state's first, and 4x4 frames of one colour each episode:
    (0, 51, 255) then (255, 51, 0)."""
    episodes = []
    for e, xs in enumerate(([0.0, 2.0], [4.0, 6.0])):
        state = np.array([[x, 0.5] for x in xs], np.float32)
        colour = [(0, 51, 255), (255, 51, 0)][e]
        frames = np.broadcast_to(np.array(colour, np.uint8), (2, 4, 4, 3)).copy()
        episodes.append(EpisodeData("move", {"observation.state": state,
                                             "action": state[:, :1] * 10, CAMERA: frames}))
    spec = {"observation.state": feature("float32", (2,)), "action": feature("float32", (1,)),
            CAMERA: feature("image", (4, 4, 3))}
    return write_dataset(tmp_path_factory.mktemp("tiny") / "ds", episodes, spec, 50)


def test_stats_read_as_lerobot_holds_them(tiny):
    """Catches reading the wrong statistic (min/max), a sample std, or a camera's statistics
    not per channel (3, 1, 1)."""
    stats = adapter_module().read_stats(tiny, KEYS)
    std = math.sqrt(5.0)  # population std of 0, 2, 4, 6
    assert torch.allclose(stats["observation.state"]["mean"], torch.tensor([3.0, 0.5]))
    assert torch.allclose(stats["observation.state"]["std"], torch.tensor([std, 0.0]))
    assert torch.allclose(stats["action"]["mean"], torch.tensor([30.0]))
    camera = stats[CAMERA]
    assert camera["mean"].shape == (3, 1, 1)
    assert torch.allclose(camera["mean"].flatten(), torch.tensor([0.5, 0.2, 0.5]))
    assert torch.allclose(camera["std"].flatten(), torch.tensor([0.5, 0.0, 0.5]))


def test_normalisation_matches_hand_values(tiny):
    """Catches a missing epsilon (the constant joint's 0/0 is NaN), dividing by the
    variance, and an un-normalisation that does not invert the normalisation."""
    m = adapter_module()
    norm = m.LerobotNormalisation(m.read_stats(tiny, KEYS))
    state = torch.tensor([[6.0, 0.5], [1.0, 0.5]])
    out = norm.observation({"observation.state": state})["observation.state"]
    expected = torch.tensor([[3.0 / math.sqrt(5.0), 0.0], [-2.0 / math.sqrt(5.0), 0.0]])
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(norm.action(torch.tensor([[1.0], [-0.5]])),
                          torch.tensor([[30.0 + 10 * math.sqrt(5.0)],
                                        [30.0 - 5 * math.sqrt(5.0)]]))


def test_camera_frame_averaged_down_then_normalised(tiny):
    """A 480x640-style uint8 frame (here 8x8 for a 4x4 dataset) is averaged down by whole
    blocks and normalised per channel. Catches channels taken in the wrong order or left
    last, a frame not put in [0, 1], and the dataset's statistics used where the run asked
    for ImageNet's."""
    m = adapter_module()
    frame = np.zeros((1, 8, 8, 3), np.uint8)
    frame[..., 0] = 255  # red: 1.0 in [0, 1]
    frame[:, :, ::2, 2] = 102  # blue: half the columns 0.4, so 0.2 averaged
    image = m.camera_input(torch.from_numpy(frame), (4, 4))
    assert image.shape == (1, 3, 4, 4)
    assert torch.allclose(image[0, :, 0, 0], torch.tensor([1.0, 0.0, 0.2]))
    own = m.LerobotNormalisation(m.read_stats(tiny, KEYS)).observation({CAMERA: image})[CAMERA]
    assert torch.allclose(own[0, :, 0, 0], torch.tensor([1.0, -0.2 / 1e-8, -0.6]), rtol=1e-5)
    imagenet = m.LerobotNormalisation(m.read_stats(tiny, KEYS, imagenet_cameras=True))
    pixel = imagenet.observation({CAMERA: image})[CAMERA][0, :, 0, 0]
    assert torch.allclose(pixel, torch.tensor([(1 - 0.485) / 0.229, -0.456 / 0.224,
                                               (0.2 - 0.406) / 0.225]), atol=1e-5)
    assert torch.equal(imagenet.stats["observation.state"]["mean"], torch.tensor([3.0, 0.5]))


def test_missing_statistics_named(tiny):
    """Catches a silent default for a feature the dataset has no statistics for."""
    with pytest.raises(KeyError, match="stats.json.*observation.images.side"):
        adapter_module().read_stats(tiny, ["observation.images.side"])



def test_tasks_parquet_indexed_by_text_as_lerobot_writes_it(tiny):
    """meta/tasks.parquet marks the task text as the pandas index (lerobot reads it with
    `pd.read_parquet` and takes `tasks.iloc[i].name`): without that, lerobot's
    `LeRobotDataset` gave the row number 0 for every frame's task, not its text. Our own
    reader still reads the text."""
    import json

    import pyarrow.parquet as pq
    from embodichain_models.data.lerobot.metadata import read_meta

    table = pq.read_table(tiny / "meta" / "tasks.parquet")
    pandas = json.loads(table.schema.metadata[b"pandas"])
    assert pandas["index_columns"] == ["task"]
    assert table.column("task").to_pylist() == ["move"]
    assert read_meta(tiny).tasks == ["move"]
