"""`prepare --cameras` shows the progress of its rendering and encoding (R-UX-1): the
episodes and frames rendered of every camera, frames/s and the time left, then that the
videos are being encoded; `--no-progress` shows nothing.

Catches: a recording silent for the 30-50 minutes it renders (no progress wired to the
frames), a progress that counts one camera's frames only or per episode, and one that
ignores --no-progress. Two 4-step episodes, a fake clock: no timing."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from embodichain_models.data.aloha.prepare import command_line, features, rendering_progress
from embodichain_models.data.aloha.record import LazyEpisodes, Recorder
from embodichain_models.data.lerobot.writer import write_dataset
from embodichain_models.envs.aloha.scene import RenderingUnavailable
from embodichain_models.envs.aloha.tasks import TASKS
from rich.console import Console

STEPS = 4
SIZE = (24, 32)


class TickingClock:
    """Each reading is 0.5 s after the previous one."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


def test_rendering_shows_episodes_frames_per_second_and_time_left(tmp_path: Path) -> None:
    recorder = Recorder(TASKS["transfer_cube"], steps=STEPS)
    try:
        recorder.scene.check_camera("top")
        recorder.scene.check_camera("angle")
    except RenderingUnavailable as exc:  # no OpenGL here (absent hardware/driver)
        pytest.skip(str(exc))
    demos = [recorder.demonstrate(seed) for seed in (3, 4)]
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    cameras = ["top", "angle"]
    with rendering_progress(demos, cameras, True, console=console, clock=TickingClock(),
                            every_s=5) as rendered:
        write_dataset(tmp_path / "cam", LazyEpisodes(recorder, demos, cameras, SIZE, rendered),
                      features(TASKS["transfer_cube"], cameras, SIZE), 50, robot_type="aloha")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("rendering top, angle: 0/2 episodes  1/16 frames")
    counts = [tuple(map(int, re.search(r"(\d+)/2 episodes  (\d+)/16 frames", line).groups()))
              for line in lines]
    assert 2 < len(lines) < 16  # every 5 s of the clock, not every frame
    assert all(episodes == frames // 8 for episodes, frames in counts), lines
    assert [f for _, f in counts] == sorted(f for _, f in counts)  # never backwards
    assert lines[-1].startswith("encoding the videos: 2/2 episodes  16/16 frames")
    assert "frames/s  left 0:00:00  elapsed" in lines[-1]
    assert (tmp_path / "cam" / "meta" / "info.json").is_file()

    out.truncate(0)
    with rendering_progress(demos, cameras, False, console=console) as rendered:
        rendered()
    assert out.getvalue() == ""


def test_no_progress_is_an_option_of_prepare() -> None:
    args = command_line().parse_args(["out", "--task", "insertion", "--no-progress"])
    assert args.no_progress
    assert not command_line().parse_args(["out", "--task", "insertion"]).no_progress


@pytest.mark.parametrize("progress", [True, False])
def test_prepare_hands_its_progress_option_to_the_rendering(monkeypatch, tmp_path: Path,
                                                           progress: bool) -> None:
    """Catches `--no-progress` lost inside `prepare` (a name that shadowed the option made
    every recording show its rendering): the rendering's progress is enabled exactly as
    asked. Stopped where the rendering would begin."""
    import embodichain_models.data.aloha.prepare as module

    asked = []

    class Stop(Exception):
        pass

    def rendering_progress(demos, cameras, enabled, **options):
        asked.append(enabled)
        raise Stop

    monkeypatch.setattr(module, "rendering_progress", rendering_progress)
    with pytest.raises(Stop):
        module.prepare(tmp_path / "out", "transfer_cube", 1, seed=3, cameras=["top"],
                       size=SIZE, log=None, progress=progress)
    assert asked == [progress]
