"""The ALOHA benchmark's data (R-ALOHA-1, embodichain-models[sim]): ACT's scripted experts
succeed in gym-aloha's scenes, and `prepare` records their replayed episodes as a LeRobot
v3.0 dataset that the project's reader gives back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from embodichain_models.data.aloha.prepare import features, prepare
from embodichain_models.data.aloha.record import LazyEpisodes, Recorder
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.writer import write_dataset
from embodichain_models.envs.aloha.scene import RenderingUnavailable
from embodichain_models.envs.aloha.tasks import EVAL_SEED, JOINT_NAMES, TASKS

SEEDS = (3, 4)  # demonstration seeds of the dataset below


@pytest.fixture(scope="module")
def recorders() -> dict[str, Recorder]:
    return {name: Recorder(task) for name, task in TASKS.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("aloha") / "transfer_cube"
    report = prepare(root, "transfer_cube", episodes=2, seed=SEEDS[0], log=None)
    return root, report


def test_prepare_records_lerobot_v30_read_back_equal_to_what_was_recorded(
        recorders, dataset) -> None:
    """Catches rows stored out of order, in another dtype or shape, a wrong fps, task text or
    feature list, observations taken after the action rather than before it, and seeds
    that overlap the evaluation's: the reader's examples equal a second recording of the
    same seeds (the physics is deterministic), frame by frame."""
    root, report = dataset
    assert report["seeds"] == list(SEEDS) and report["expert_success_rate"] == 1.0
    assert report["expert_finish_rate"] == 1.0  # the seeds CI records finish the task
    assert max(report["seeds"]) < EVAL_SEED
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 50
    assert info["features"]["observation.state"]["names"] == JOINT_NAMES
    assert info["features"]["observation.environment_state"]["shape"] == [7]
    frames = LeRobotFrames(root)
    assert [e.length for e in frames.episodes] == [400, 400]
    assert frames.task(0) == TASKS["transfer_cube"].text
    recorded = [recorders["transfer_cube"].demonstrate(seed) for seed in SEEDS]
    for key, attribute in (("observation.state", "state"), ("action", "action"),
                           ("observation.environment_state", "env_state")):
        stored = frames.tables.columns[key]
        expected = np.concatenate([getattr(d, attribute) for d in recorded])
        assert stored.dtype == np.float32 and np.array_equal(stored, expected), key
    cubes = frames.tables.columns["observation.environment_state"][399::400]
    assert (cubes[:, 2] > 0.1).all()  # each episode ends with the cube held off the table
    example = frames[400 + 17]  # episode 1, frame 17
    assert torch.equal(example["observation.state"], torch.from_numpy(recorded[1].state[17]))
    assert int(example["episode_index"]) == 1 and int(example["frame_index"]) == 17


def test_a_camera_is_recorded_as_video_of_the_replayed_frames(recorders, tmp_path) -> None:
    """Catches a camera rendered at another step, size or camera than the row it belongs to
    (the frames are rendered in a second replay, checked against the recorded states): the
    decoded video matches the scene's own rendering within the codec's loss."""
    recorder = recorders["transfer_cube"]
    try:
        recorder.scene.check_camera("top")
    except RenderingUnavailable as exc:  # no OpenGL here (absent hardware/driver)
        pytest.skip(str(exc))
    demo = recorder.demonstrate(5, stop_at_success=False)
    for name in ("state", "env_state", "action", "targets", "rewards"):
        setattr(demo, name, getattr(demo, name)[:12])
    size = (24, 32)
    episodes = LazyEpisodes(recorder, [demo], ["top"], size)
    write_dataset(tmp_path / "cam", episodes, features(TASKS["transfer_cube"], ["top"], size),
                  50, robot_type="aloha")
    frames = LeRobotFrames(tmp_path / "cam")
    image = frames[7]["observation.images.top"]
    assert image.shape == (3, 24, 32)
    recorder.scene.reset(poses=demo.poses)
    for action in demo.targets[:7]:
        recorder.scene.step(action)
    truth = torch.from_numpy(recorder.render("top", size)).permute(2, 0, 1).float() / 255
    assert (image - truth).abs().mean() < 0.05


@pytest.mark.slow  # two spawned processes import MuJoCo and build their scenes (~25 s)
def test_frames_rendered_in_worker_processes_are_the_same_bytes(recorders, tmp_path) -> None:
    """Catches worker processes that render another episode, step or camera than the one
    the writer stores, or scenes that differ from this process's (`prepare --workers`):
    the dataset written with 2 rendering processes equals the one written with none, file
    by file, byte for byte; the progress still counts every frame."""
    recorder = recorders["transfer_cube"]
    try:
        recorder.scene.check_camera("top")
    except RenderingUnavailable as exc:  # no OpenGL here (absent hardware/driver)
        pytest.skip(str(exc))
    demos = [recorder.demonstrate(seed) for seed in (5, 6, 7)]
    for demo in demos:
        for name in ("state", "env_state", "action", "targets", "rewards"):
            setattr(demo, name, getattr(demo, name)[:6])
    size = (24, 32)
    spec = features(TASKS["transfer_cube"], ["top", "angle"], size)
    counted = {1: 0, 2: 0}
    for workers in counted:
        def rendered(workers: int = workers) -> None:
            counted[workers] += 1

        with LazyEpisodes(recorder, demos, ["top", "angle"], size, rendered,
                          workers=workers) as episodes:
            assert (episodes.pool is not None) == (workers > 1)  # the processes are used
            write_dataset(tmp_path / f"w{workers}", episodes, spec, 50, robot_type="aloha",
                          episodes_per_file=2)
    assert counted == {1: 3 * 6 * 2, 2: 3 * 6 * 2}
    files = sorted(p.relative_to(tmp_path / "w1") for p in (tmp_path / "w1").rglob("*")
                   if p.is_file())
    assert any(f.suffix == ".mp4" for f in files) and len(files) > 4
    for name in files:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), \
            name


def test_no_rendering_process_is_refused_before_anything_runs(tmp_path, capsys) -> None:
    """Catches `--workers 0` reaching the pool (a hang or a stack trace after the experts
    ran): exit 2 naming the option, nothing written."""
    from embodichain_models.data.aloha.prepare import main

    with pytest.raises(SystemExit) as stop:
        main(["--task", "transfer_cube", "--workers", "0", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert "--workers 0: at least 1" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _numbered_dataset(root: Path, cameras: tuple[str, ...] = (),
                      size: tuple[int, int] = (48, 64), frames: int = 6) -> Path:
    """Two made-up transfer-cube episodes whose every value at frame t of episode e is
    100 e + t (camera frames black): which frame a feature was read from shows in it."""
    from embodichain_models.data.lerobot.writer import EpisodeData

    task = TASKS["transfer_cube"]
    episodes = []
    for e in range(2):
        t = (np.arange(frames, dtype=np.float32) + 100 * e)[:, None]
        values = {"observation.state": t.repeat(len(JOINT_NAMES), 1),
                  "observation.environment_state": t.repeat(len(task.env_state_names), 1),
                  "action": t.repeat(len(JOINT_NAMES), 1)}
        for camera in cameras:
            values[f"observation.images.{camera}"] = np.zeros((frames, *size, 3), np.uint8)
        episodes.append(EpisodeData(task.text, values))
    write_dataset(root, episodes, features(task, cameras, size), 50, robot_type="aloha")
    return root


def _act_config(root: Path, cameras: list[str], chunk: int = 3, val_episodes: int = 1):
    from types import SimpleNamespace

    return SimpleNamespace(data=SimpleNamespace(task="transfer_cube", root=root,
                                                cameras=cameras, chunk=chunk,
                                                val_episodes=val_episodes,
                                                identity="metadata"))


def test_the_action_chunk_starts_at_the_frames_own_action(tmp_path: Path) -> None:
    """Catches the chunk's timestamps starting one step late (`delta_timestamps` from 1/fps
    instead of 0): ACT's chunk at frame t is the actions of frames t .. t + chunk - 1, the
    first one the action the policy executes at t. Frame 1 of the held-out episode (1)
    reads actions 101, 102, 103."""
    from embodichain_models.policies.act.data import act_data

    data = act_data(_act_config(_numbered_dataset(tmp_path / "numbered"), []))
    assert data.held_out is not None
    example = data.held_out[1]
    assert example["observation.state"][0].item() == 101
    assert example["action"][:, 0].tolist() == [101, 102, 103]


def test_frames_whose_width_does_not_divide_the_cameras_are_refused(tmp_path: Path) -> None:
    """Catches the frame-size check reduced to the height: frames of 48x60 (480 / 48 is
    whole, 640 / 60 is not) cannot be averaged down from the camera's 480x640 by whole
    blocks, so a dataset of them is refused naming the size, and so is `prepare --size
    480x600`; 48x64 and 240x320 are taken."""
    import argparse

    from embodichain_models.data.aloha.prepare import parse_size
    from embodichain_models.policies.act.data import act_data

    from embodichain.learning.sl import UsageError

    root = _numbered_dataset(tmp_path / "narrow", ("top",), (48, 60), frames=2)
    with pytest.raises(UsageError, match="holds 'top' frames of 48x60, not a whole fraction"):
        act_data(_act_config(root, ["top"], val_episodes=0))
    with pytest.raises(argparse.ArgumentTypeError, match="480x600"):
        parse_size("480x600")
    assert parse_size("240x320") == (240, 320)
    root = _numbered_dataset(tmp_path / "whole", ("top",), (48, 64), frames=2)
    assert act_data(_act_config(root, ["top"], val_episodes=0)).image_sizes == \
        {"top": (48, 64)}


def test_recorded_frames_are_averaged_down_rounded_as_the_policy_sees_them() -> None:
    """Catches frames truncated instead of rounded when `prepare --size` averages them down
    (`record.downsample`): the dataset's frame must be what the policy's `frames_in`
    computes of the camera's frame, to the uint8 step (within half of it); truncating
    darkens most pixels by up to one step. 2x2 blocks of 0, 1, 1, 1 average to 0.75: 1."""
    from embodichain_models.data.aloha.record import downsample
    from embodichain_models.policies.vision.backbone import frames_in

    assert downsample(np.array([[0, 1], [1, 1]], np.uint8)[..., None].repeat(3, -1),
                      (1, 1)).tolist() == [[[1, 1, 1]]]
    frame = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    stored = torch.from_numpy(downsample(frame, (12, 16))).permute(2, 0, 1).float() / 255
    seen = frames_in(torch.from_numpy(frame)[None], (12, 16))[0]
    assert (stored - seen).abs().max().item() <= 0.5 / 255 + 1e-6
