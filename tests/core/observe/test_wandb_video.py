"""An evaluation's films sent to Weights & Biases (R-OBS-3, R-EVAL-1), through a fake `wandb`
module: no network, no wandb install needed; the call the logger makes is what is checked."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from embodichain.core.evaluation.video import FilmEncoder
from embodichain.core.observe.loggers import LoggingMetricsWriter

TAG = "evaluation/episode_0"


def fake_wandb(logged: list[tuple[dict[str, Any], int]]) -> types.ModuleType:
    module = types.ModuleType("wandb")

    class Run:
        step = 0

        def log(self, values: dict[str, Any], step: int) -> None:
            logged.append((values, step))

        def finish(self) -> None:
            pass

    class Video:
        def __init__(self, data: Any, format: str | None = None) -> None:  # noqa: A002
            self.data, self.format = data, format

    module.init = lambda **_: Run()
    module.Video = Video
    return module


def test_the_films_of_an_evaluation_reach_wandb_as_mp4_videos(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Each film is logged once under its tag at the evaluation's update, as a `wandb.Video`
    of the mp4 file under the run directory; a continued run does not send a step an earlier
    process sent; a video wandb refuses is a warning, never the run's failure. Catches the
    films never reaching wandb, logged at another step or as another format, re-sent after
    a resume (wandb's steps would go back), and a video error ending the training."""
    logged: list[tuple[dict[str, Any], int]] = []
    wandb = fake_wandb(logged)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    film = FilmEncoder(10)
    for shade in (0, 120, 240):
        film.add(np.full((8, 8, 3), shade, np.uint8))
    data = film.finish()
    assert data is not None
    path = tmp_path / "evaluations" / "update_000004" / "episode_0000.mp4"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)

    def writer() -> LoggingMetricsWriter:
        return LoggingMetricsWriter(tmp_path, ["jsonl", "wandb"],
                                    identity={"run_id": "run-1", "config": {}})

    first = writer()
    first.write({"step": 4, "validation/success_rate": 0.5})
    first.write_videos(4, {TAG: (path, data)}, 10)
    first.close()
    videos = [(values[TAG], step) for values, step in logged if TAG in values]
    assert len(videos) == 1 and videos[0][1] == 4
    video = videos[0][0]
    assert isinstance(video, wandb.Video) and video.format == "mp4"
    assert Path(video.data) == path and Path(video.data).read_bytes() == data

    logged.clear()
    continued = writer()  # a resume: step 4 was sent by the first process
    continued.write_videos(4, {TAG: (path, data)}, 10)
    assert logged == []
    continued.write({"step": 6, "validation/success_rate": 1.0})
    continued.write_videos(6, {TAG: (path, data)}, 10)
    assert [step for values, step in logged if TAG in values] == [6]

    def refused(*_: Any, **__: Any) -> None:
        raise ValueError("unsupported video")

    monkeypatch.setattr(wandb, "Video", refused)
    with caplog.at_level(logging.WARNING, logger="embodichain"):
        continued.write_videos(8, {TAG: (path, data)}, 10)
    assert "WandbLogger could not show the video" in caplog.text
    assert "ValueError: unsupported video" in caplog.text
    continued.close()
