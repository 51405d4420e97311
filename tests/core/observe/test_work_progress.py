"""Long work's progress (core/observe/work_progress.py, R-UX-1): its counts, rate and time
left from a fake clock; plain lines every `every_s` seconds off a terminal, a rich line on
one; nothing when disabled, before `after_s`, or where no command allowed it.

Catches: counts or items off by one (episodes counted per frame, or rounded up too early),
a rate or time left from the wrong clock or the wrong total, plain output on every advance
(a 20 000-frame recording printing 20 000 lines) or never, and progress shown although
`--no-progress` (or another rank than 0) said not to."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from embodichain.core.observe.work_progress import (
    WorkProgress,
    _Line,
    showing_progress,
    work_progress,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_counts_rate_and_time_left_follow_the_work() -> None:
    clock = FakeClock()
    console, out = plain()
    progress = WorkProgress("rendering top", 2 * 400, "frames", items=("episodes", 400),
                            console=console, clock=clock, every_s=30)
    assert progress.status() == "0/2 episodes  0/800 frames  -  left -:--:--  elapsed 0:00:00"
    clock.now += 40
    progress.advance(399)
    assert progress.status().startswith("0/2 episodes  399/800 frames")
    clock.now += 0.1
    progress.advance()
    assert progress.done == 400 and progress.rate() == pytest.approx(400 / 40.1)
    assert progress.status() == ("1/2 episodes  400/800 frames  9.975 frames/s  "
                                 "left 0:00:40  elapsed 0:00:40")


def test_off_a_terminal_a_plain_line_every_period_and_at_the_end() -> None:
    clock = FakeClock()
    console, out = plain()
    with WorkProgress("hashing", 100, "files", console=console, clock=clock,
                      every_s=30) as progress:
        for _ in range(99):
            clock.now += 1
            progress.advance()
        assert len(out.getvalue().splitlines()) == 4  # at 1 s, 31 s, 61 s, 91 s
        clock.now += 1
        progress.advance()
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and lines[-1].startswith("hashing: 100/100 files  1 files/s")
    assert lines[1].startswith("hashing: 31/100 files")


def test_bytes_are_shown_in_their_units() -> None:
    clock = FakeClock()
    progress = WorkProgress("hashing", 3_000_000_000, "B", clock=clock, enabled=False)
    clock.now += 10
    progress.advance(1_500_000_000)
    assert progress.status() == "1.5 GB of 3 GB  150 MB/s  left 0:00:10  elapsed 0:00:10"


def test_on_a_terminal_the_rich_line_shows_the_phase_and_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    clock = FakeClock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with WorkProgress("rendering top", 800, "frames", items=("episodes", 400),
                      console=console, clock=clock) as progress:
        clock.now += 10
        progress.advance(400)
        progress.describe("encoding")
        console.print(progress._live.renderable if progress._live else "no live display")
    text = out.getvalue()
    assert "encoding" in text and "1/2 episodes  400/800 frames  40 frames/s" in text


def test_a_narrow_terminal_keeps_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    clock = FakeClock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    progress = WorkProgress("rendering top", 20000, "frames", items=("episodes", 400),
                            console=console, clock=clock, enabled=False)
    clock.now += 1000
    progress.advance(9000)
    console.print(_Line(progress))
    line = out.getvalue().rstrip("\n")
    assert line == ("rendering top  22/50 episodes  9000/20000 frames  9 frames/s  "
                    "left 0:20:22"), line


def test_nothing_is_shown_when_disabled_or_before_after_s() -> None:
    clock = FakeClock()
    console, out = plain()
    with WorkProgress("x", 10, "files", console=console, clock=clock, enabled=False) as p:
        p.advance(10)
    with WorkProgress("y", 10, "files", console=console, clock=clock, after_s=2) as p:
        clock.now += 1
        p.advance(5)
        assert out.getvalue() == ""
        clock.now += 1
        p.advance(1)
    assert out.getvalue().startswith("y: 6/10 files")


def test_work_progress_shows_only_where_a_command_allowed_it_on_rank_zero(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert not work_progress("x", 1, "files").enabled
    with showing_progress(True):
        assert work_progress("x", 1, "files").enabled
        monkeypatch.setenv("RANK", "1")
        assert not work_progress("x", 1, "files").enabled
    with showing_progress(False):
        monkeypatch.setenv("RANK", "0")
        assert not work_progress("x", 1, "files").enabled


def test_steps_are_named_as_they_begin_and_counted_when_the_next_does() -> None:
    clock = FakeClock()
    console, out = plain()
    with WorkProgress("export", 3, "steps", console=console, clock=clock,
                      estimate=False) as progress:
        progress.begin("tracing")
        clock.now += 65
        progress.begin("checking")
    assert out.getvalue().splitlines() == ["tracing: 0/3 steps  elapsed 0:00:00",
                                           "checking: 1/3 steps  elapsed 0:01:05"]
