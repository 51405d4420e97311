"""The ALOHA tests' shared recording: the tiny top-camera dataset that ACT's camera run and
Diffusion Policy's tests both train on (recorded once per session)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def camera_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two transfer-cube demonstrations cut to their first 30 steps, the top camera
    rendered at 480x640 and stored at 24x32 (prepare's path, shortened)."""
    from embodichain_models.data.aloha.prepare import features
    from embodichain_models.data.aloha.record import LazyEpisodes, Recorder
    from embodichain_models.data.lerobot.writer import write_dataset
    from embodichain_models.envs.aloha.tasks import FPS, TASKS

    root = tmp_path_factory.mktemp("aloha_camera") / "data"
    recorder = Recorder(TASKS["transfer_cube"])
    demos = []
    for seed in (0, 1):
        demo = recorder.demonstrate(seed)
        cut = {k: getattr(demo, k)[:30] for k in ("state", "env_state", "action", "rewards",
                                                  "targets")}
        demos.append(dataclasses.replace(demo, **cut))
    write_dataset(root, LazyEpisodes(recorder, demos, ["top"], (24, 32)),  # type: ignore[arg-type]
                  features(TASKS["transfer_cube"], ["top"], (24, 32)), FPS, robot_type="aloha")
    return root
