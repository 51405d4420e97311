"""The progress line at 60 columns and up: update N/total, loss, val_mse and eta always
readable, labelled, and a steady layout (issue 12, R-UX-1)."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from embodichain.core.observe.progress import ProgressLine, ProgressReporter, clock


@pytest.fixture(autouse=True)
def capable_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich ignores a console's width under TERM=dumb (as CI shells may set): these tests
    are about a real terminal's layout."""
    monkeypatch.setenv("TERM", "xterm-256color")


STEPS = [(1, 3.2, None), (10, 0.51234, None), (50, 0.0001234567, 2.1), (150, 12345.678, 0.52),
         (200, 0.29, 0.2934)]


def rendered(width: int, total: int = 200) -> list[str]:
    out = io.StringIO()
    console = Console(width=width, file=out, force_terminal=True, color_system=None)
    reporter = ProgressReporter(total, 0, False, 10, console=console)
    for step, loss, val in STEPS:
        reporter.update(step, loss=loss, val=val)
        console.print(ProgressLine(reporter))
    return out.getvalue().splitlines()


@pytest.mark.parametrize("width", [60, 72, 80, 100, 140])
def test_essentials_fit_labelled_and_steady(width: int) -> None:
    lines = rendered(width)
    assert len(lines) == len(STEPS)  # one line each: nothing wrapped
    for line, (step, loss, val) in zip(lines, STEPS, strict=True):
        assert len(line) <= width, line
        assert re.search(rf"update +{step}/200", line), line
        assert f"loss {loss:.4g}".replace(" ", "") in line.replace(" ", ""), line
        shown = "-" if val is None else f"{val:.4g}"
        assert re.search(rf"val_mse +{re.escape(shown)}( |$)", line), line
        assert re.search(r"eta (\d+:\d\d:\d\d|-:--:--)", line), line
        assert "…" not in line
    # Fixed-width fields: every label starts in the same column on every refresh, so
    # nothing (the bar included) jitters.
    for label in ("loss", "val_mse", "eta"):
        assert len({line.index(f" {label} ") for line in lines}) == 1, (label, lines)
    if width >= 80:
        assert all("elapsed" in line for line in lines)
    if width >= 100:
        assert all("━" in line or " " * 10 in line for line in lines)  # room for a bar


def test_the_live_bar_renders_to_a_terminal() -> None:
    out = io.StringIO()
    console = Console(width=60, file=out, force_terminal=True, color_system=None)
    reporter = ProgressReporter(200, 0, True, 10, console=console)
    assert reporter.rich
    reporter.update(100, loss=0.5)
    reporter.close()
    assert "update 100/200" in out.getvalue()


def test_clock() -> None:
    assert clock(0) == "0:00:00" and clock(3725) == "1:02:05" and clock(None) == "-:--:--"
    assert clock(float("nan")) == "-:--:--" and clock(400 * 3600) == "16d16h"
