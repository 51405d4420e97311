"""The LeRobot source (embodichain-models[lerobot]) on tiny datasets written here: three
episodes of uneven lengths with a state, an action, an image feature (PNG in the parquet
rows) and a video feature (mp4), in both layouts (v3.0: several episodes per file; v2.1:
one file per episode)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from embodichain_models.data.lerobot import LeRobotDecodeError, LeRobotFormatError, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.video import encode_video
from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

FPS = 10
LENGTHS = (5, 9, 7)
VIDEO = "observation.images.top"
IMAGE = "observation.image"
FEATURES = {"observation.state": feature("float32", (3,)), "action": feature("float32", (2,)),
            IMAGE: feature("image", (8, 12, 3)), VIDEO: feature("video", (16, 16, 3))}


def _video_frames(episode: int, n: int) -> np.ndarray:
    """Smooth frames (a level that changes every frame, a gentle gradient) that the codec
    keeps to within a few levels."""
    level = 40 + 25 * ((np.arange(n) + 3 * episode) % 7)
    ramp = np.linspace(0, 30, 16)
    frames = level[:, None, None, None] + ramp[None, None, :, None] + np.zeros((1, 16, 1, 3))
    frames[..., 1] += 40
    return frames.clip(0, 255).astype(np.uint8)


def _episodes() -> list[EpisodeData]:
    rng = np.random.default_rng(7)
    episodes = []
    for e, n in enumerate(LENGTHS):
        episodes.append(EpisodeData(task=f"task {e % 2}", values={
            "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
            "action": rng.standard_normal((n, 2)).astype(np.float32),
            IMAGE: rng.integers(0, 256, (n, 8, 12, 3), dtype=np.uint8),
            VIDEO: _video_frames(e, n)}))
    return episodes


EPISODES = _episodes()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lerobot")
    return {v: write_dataset(root / v, EPISODES, FEATURES, FPS, version=v, episodes_per_file=2)
            for v in ("v3.0", "v2.1")}


@pytest.fixture()
def copy(datasets: dict[str, Path], tmp_path: Path):
    def make(version: str = "v3.0") -> Path:
        return Path(shutil.copytree(datasets[version], tmp_path / version))
    return make


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_every_example_holds_the_written_values_and_frames(version: str,
                                                           datasets: dict[str, Path]) -> None:
    """Catches rows of the wrong episode or order (v3.0 packs two episodes per file), a
    global index or task index taken from the wrong place, an image decoded in the wrong
    layout (it must be float CHW in [0, 1], losslessly equal) and a video frame of the
    wrong timestamp (frames differ by 25 levels from one to the next; the codec's error
    is a few)."""
    dataset = LeRobotFrames(datasets[version], task_text=True)
    assert len(dataset) == sum(LENGTHS)
    i = 0
    for e, episode in enumerate(EPISODES):
        for t in range(episode.length):
            ex = dataset[i]
            assert torch.equal(ex["observation.state"],
                               torch.from_numpy(episode.values["observation.state"][t]))
            assert torch.equal(ex["action"], torch.from_numpy(episode.values["action"][t]))
            image = torch.from_numpy(episode.values[IMAGE][t]).permute(2, 0, 1).float() / 255
            assert ex[IMAGE].dtype == torch.float32 and torch.equal(ex[IMAGE], image)
            frame = torch.from_numpy(episode.values[VIDEO][t]).permute(2, 0, 1).float() / 255
            assert ex[VIDEO].shape == (3, 16, 16)
            assert (ex[VIDEO] - frame).abs().mean() < 4 / 255, (e, t)
            assert (ex[VIDEO] - frame).abs().max() < 12 / 255, (e, t)
            assert (int(ex["episode_index"]), int(ex["frame_index"]), int(ex["index"])) == (e, t, i)
            assert ex["timestamp"].item() == pytest.approx(t / FPS)
            assert ex["task"] == episode.task and dataset.task(int(ex["task_index"])) == ex["task"]
            i += 1


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_windows_repeat_the_edge_frame_and_mark_it_padded_at_both_ends(
        version: str, datasets: dict[str, Path]) -> None:
    """Catches windows that cross into the neighbouring episode (episode 1 sits between
    two others), pad masks inverted or missing, and video windows that ignore the
    clamping (the frame must be the episode's edge frame)."""
    deltas = {"action": [-0.2, -0.1, 0.0, 0.1, 0.2], VIDEO: [-0.1, 0.0]}
    dataset = LeRobotFrames(datasets[version], delta_timestamps=deltas)
    actions = EPISODES[1].values["action"]
    first, last = LENGTHS[0], LENGTHS[0] + LENGTHS[1] - 1  # episode 1's first and last frames
    start = dataset[first]
    assert start["action"].shape == (5, 2)
    assert start["action_is_pad"].tolist() == [True, True, False, False, False]
    assert torch.equal(start["action"], torch.from_numpy(actions[[0, 0, 0, 1, 2]]))
    assert start[f"{VIDEO}_is_pad"].tolist() == [True, False]
    assert torch.equal(start[VIDEO][0], start[VIDEO][1])  # the edge frame, repeated
    end = dataset[last]
    assert end["action_is_pad"].tolist() == [False, False, False, True, True]
    assert torch.equal(end["action"], torch.from_numpy(actions[[6, 7, 8, 8, 8]]))
    assert end[f"{VIDEO}_is_pad"].tolist() == [False, False]
    assert not torch.equal(end[VIDEO][0], end[VIDEO][1])
    middle = dataset[first + 4]
    assert not middle["action_is_pad"].any()
    assert torch.equal(middle["action"], torch.from_numpy(actions[2:7]))


def test_an_episode_subset_and_normalisation_by_the_dataset_statistics(
        datasets: dict[str, Path]) -> None:
    """Catches a subset that keeps the dataset's order or global positions, and statistics
    that are not those of the written values (mean/std and min/max)."""
    dataset = LeRobotFrames(datasets["v3.0"], episodes=[2, 0],
                            normalize={"observation.state": "mean_std", "action": "min_max"})
    assert len(dataset) == LENGTHS[2] + LENGTHS[0]
    states = np.concatenate([e.values["observation.state"] for e in EPISODES]).astype(np.float64)
    actions = np.concatenate([e.values["action"] for e in EPISODES]).astype(np.float64)
    ex = dataset[1]  # episode 2, frame 1
    assert int(ex["episode_index"]) == 2 and int(ex["index"]) == LENGTHS[0] + LENGTHS[1] + 1
    raw = EPISODES[2].values
    expected = (raw["observation.state"][1] - states.mean(0)) / states.std(0)
    assert torch.allclose(ex["observation.state"], torch.tensor(expected, dtype=torch.float32),
                          atol=1e-5)
    lo, hi = actions.min(0), actions.max(0)
    expected = 2 * (raw["action"][1] - lo) / (hi - lo) - 1
    assert torch.allclose(ex["action"], torch.tensor(expected, dtype=torch.float32), atol=1e-5)
    assert int(dataset[LENGTHS[2]]["episode_index"]) == 0
    with pytest.raises(LeRobotFormatError, match="episode 5 is not in the dataset"):
        LeRobotFrames(datasets["v3.0"], episodes=[0, 5])


def test_two_dataloader_workers_load_the_examples_of_none_bitwise(
        datasets: dict[str, Path]) -> None:
    """Catches decoder state shared across a fork (a container opened before it) and
    results that depend on which worker decodes which example; the training process
    keeps no open container and a pickled dataset carries none."""
    dataset = LeRobotFrames(datasets["v3.0"], delta_timestamps={VIDEO: [-0.1, 0.0]})
    assert not dataset._videos._containers  # opened on first use, in each process
    order = [20, 3, 11, 0, 7, 15, 4, 19, 8]
    direct = [dataset[i] for i in order]
    parent_containers = dict(dataset._videos._containers)
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(dataset, order), batch_size=3,
                                         num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert dict(dataset._videos._containers) == parent_containers
    for j, i in enumerate(order):
        for key, value in direct[j].items():
            assert torch.equal(batches[j // 3][key][j % 3], value), (i, key)
    assert pickle.loads(pickle.dumps(dataset))._videos._containers == {}


def test_the_identity_follows_the_content_and_is_cached_outside_the_dataset(
        copy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an identity from paths or metadata alone: one changed table value, or a
    video replaced by another of the same length, must change it; an unchanged dataset
    gives the same identity from the cached digests, kept in the user cache, not beside
    the files."""
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    root = copy()
    first = lerobot_source(root).identity
    assert not list(root.rglob("*.sha256")) and list((tmp_path / "cache").rglob("*.json"))
    assert lerobot_source(root).identity == first
    assert lerobot_source(root, episodes=[0, 1]).identity != first
    table = pq.read_table(root / "data/chunk-000/file-001.parquet")
    state = table.column("observation.state").to_pylist()
    state[3][1] += 0.5
    import pyarrow as pa

    column = pa.FixedSizeListArray.from_arrays(pa.array(np.array(state, np.float32).ravel()), 3)
    table = table.set_column(table.column_names.index("observation.state"),
                             "observation.state", column)
    pq.write_table(table, root / "data/chunk-000/file-001.parquet")
    changed_row = lerobot_source(root).identity
    assert changed_row != first
    video = root / f"videos/{VIDEO}/chunk-000/file-000.mp4"
    frames = np.concatenate([_video_frames(e, n) for e, n in enumerate(LENGTHS[:2])])
    encode_video(video, 255 - frames, FPS)
    assert lerobot_source(root).identity not in (first, changed_row)


def test_a_missing_or_unknown_version_info_json_is_refused_by_name(copy) -> None:
    """Catches a reader that guesses the layout of a directory without metadata, or
    reads a format version it does not know."""
    root = copy()
    info = json.loads((root / "meta/info.json").read_text())
    (root / "meta/info.json").write_text(json.dumps({**info, "codebase_version": "v1.6"}))
    with pytest.raises(LeRobotFormatError, match=r"info.json: codebase_version 'v1.6' is not"):
        LeRobotFrames(root)
    (root / "meta/info.json").unlink()
    with pytest.raises(LeRobotFormatError, match=r"meta/info.json is missing"):
        LeRobotFrames(root)


def test_a_window_of_a_feature_the_dataset_lacks_is_refused_by_name(
        datasets: dict[str, Path]) -> None:
    """Catches delta_timestamps that silently ignore a misspelt key, or offsets that are
    not whole frames."""
    with pytest.raises(LeRobotFormatError, match=r"delta_timestamps names 'actions', which"):
        LeRobotFrames(datasets["v3.0"], delta_timestamps={"actions": [0.0, 0.1]})
    with pytest.raises(LeRobotFormatError, match=r"0.05 s is not a whole number of frames"):
        LeRobotFrames(datasets["v3.0"], delta_timestamps={"action": [0.0, 0.05]})


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_a_video_shorter_than_its_table_is_refused_at_start_up(version: str, copy) -> None:
    """Catches a check that trusts the metadata: the video of the last episode lost its
    last two frames."""
    root = copy(version)
    name = (f"videos/{VIDEO}/chunk-000/file-001.mp4" if version == "v3.0"
            else f"videos/chunk-000/{VIDEO}/episode_000002.mp4")
    encode_video(root / name, _video_frames(2, LENGTHS[2])[:-2], FPS)
    with pytest.raises(LeRobotFormatError, match=r"file-001.mp4 is shorter than its table|"
                       r"episode_000002.mp4 is shorter than its table") as caught:
        LeRobotFrames(root)
    assert "episode 2" in str(caught.value)


def test_a_corrupt_parquet_file_is_refused_naming_it(copy) -> None:
    """Catches a pyarrow error surfacing without the file, or a truncated file read as
    fewer rows."""
    root = copy()
    path = root / "data/chunk-000/file-001.parquet"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(LeRobotFormatError, match=r"file-001.parquet: not a readable parquet"):
        LeRobotFrames(root)


def test_an_undecodable_frame_names_the_episode_the_frame_and_the_file(copy) -> None:
    """Catches a decoding error that names neither where nor what (the source is loaded
    in a worker, so the message is all the user gets); the metadata and lengths are
    intact, so only decoding can find it."""
    root = copy()
    video = root / f"videos/{VIDEO}/chunk-000/file-001.mp4"
    data = bytearray(video.read_bytes())
    begin, end = data.find(b"mdat") + 4, data.find(b"moov") - 4
    data[begin:end] = b"\xff" * (end - begin)
    video.write_bytes(bytes(data))
    dataset = LeRobotFrames(root)
    assert torch.is_tensor(dataset[0][VIDEO])  # episode 0 lives in file-000
    with pytest.raises(LeRobotDecodeError, match=r"episode 2, frame 3, .*file-001.mp4"):
        dataset[LENGTHS[0] + LENGTHS[1] + 3]


def test_a_video_frame_farther_than_tolerance_s_is_refused(copy) -> None:
    """Catches the `tolerance_s` check dropped (any nearest frame accepted, however far):
    episode 2's video re-encoded at 8 fps puts its frames at k/8 s, off the table's k/10 s
    grid. Row 1 (t=0.1 s) is 0.025 s from the frame at 0.125 s: taken (that frame) with
    tolerance_s=0.03, refused with 0.02 and the default; row 2 (t=0.2 s) is 0.05 s from
    any frame: refused, naming the episode, the frame, the file and the nearest frame."""
    root = copy("v2.1")
    name = f"videos/chunk-000/{VIDEO}/episode_000002.mp4"
    written = _video_frames(2, 9)
    encode_video(root / name, written, 8)
    row = LENGTHS[0] + LENGTHS[1]  # episode 2's first row
    loose = LeRobotFrames(root, tolerance_s=0.03)
    taken = (loose[row + 1][VIDEO].permute(1, 2, 0) * 255).numpy()
    assert np.abs(taken - written[1]).mean() < 4  # the frame at 0.125 s
    with pytest.raises(LeRobotDecodeError, match=r"no video frame within tolerance_s=0.03 of "
                       r"t=0.2000 s \(episode 2, frame 2, .*episode_000002.mp4\): the nearest "
                       r"decoded frame is at 0.2500 s"):
        loose[row + 2]
    for strict in (LeRobotFrames(root, tolerance_s=0.02), LeRobotFrames(root)):
        with pytest.raises(LeRobotDecodeError, match=r"of t=0.1000 s \(episode 2, frame 1"):
            strict[row + 1]
