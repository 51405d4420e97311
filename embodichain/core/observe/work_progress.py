"""Progress of long counted work outside the training loop (R-UX-1): frames rendered, data
files hashed, an export's steps. On a terminal a rich line (what, a bar, done/total, the
rate, elapsed, the time left); otherwise a plain line every `every_s` seconds; nothing when
disabled (`--no-progress`). `after_s` holds it back until the work has lasted that long,
so quick work (digests already cached) shows nothing.

Commands that open data through a factory say once whether progress may be shown
(`showing_progress`); the code doing the work asks `work_progress(...)`, which is disabled
unless a command allowed it, and on every rank but 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Callable, Iterator
from types import TracebackType

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from embodichain.core.observe.progress import clock

HOLD_BACK_S = 2.0
"""How long `work_progress`'s work runs before it is shown (quick work shows nothing)."""
_SHOWN: contextvars.ContextVar[bool] = contextvars.ContextVar("embodichain_work_progress",
                                                              default=False)


@contextlib.contextmanager
def showing_progress(enabled: bool) -> Iterator[None]:
    """Within: `work_progress` shows (on rank 0) when `enabled`."""
    token = _SHOWN.set(enabled)
    try:
        yield
    finally:
        _SHOWN.reset(token)


def work_progress(what: str, total: int, unit: str, **options: object) -> WorkProgress:
    """A `WorkProgress` enabled where a command allowed it (`showing_progress`), on rank 0;
    held back `HOLD_BACK_S` seconds."""
    enabled = _SHOWN.get() and int(os.environ.get("RANK", "0")) == 0
    return WorkProgress(what, total, unit, enabled=enabled,
                        **{"after_s": HOLD_BACK_S, **options})  # type: ignore[arg-type]


def _amount(value: float, unit: str) -> str:
    if unit != "B":
        return f"{value:.4g} {unit}"
    for prefix in ("", "k", "M", "G", "T"):
        if value < 1000 or prefix == "T":
            return f"{value:.4g} {prefix}B"
        value /= 1000
    return f"{value:.4g} B"  # pragma: no cover - the loop returns


class WorkProgress:
    """`total` units of work (`unit`: "frames", "files", "B" for bytes), counted by
    `advance(n)`; `items=("episodes", k)` also counts every k units as one of those. Work
    in a few long steps of unequal length names each as it begins (`begin`) and shows no
    rate or time left (`estimate=False`). `clock` (seconds) is injectable for tests;
    `status()` is the line shown."""

    def __init__(self, what: str, total: int, unit: str, *, enabled: bool = True,
                 items: tuple[str, int] | None = None, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = 30.0,
                 after_s: float = 0.0, estimate: bool = True) -> None:
        self.what, self.total, self.unit, self.items = what, max(int(total), 0), unit, items
        self.estimate = estimate
        self.done = 0
        self._begun = False
        self.enabled, self.every_s, self.after_s = enabled, every_s, after_s
        self.console = console or Console(stderr=True)
        self._clock = clock
        self._start = clock()
        self._last_line: float | None = None
        self._live: Live | None = None

    def elapsed(self) -> float:
        return self._clock() - self._start

    def rate(self) -> float | None:
        """Units per second so far (None before any)."""
        elapsed = self.elapsed()
        return self.done / elapsed if self.done and elapsed > 0 else None

    def left(self) -> float | None:
        """Seconds left at the rate so far (None while unknown)."""
        rate = self.rate()
        return (self.total - self.done) / rate if rate else None

    def status(self, elapsed: bool = True) -> str:
        """`3/50 episodes  1200/20000 frames  10.2 frames/s  left 0:30:43  elapsed 0:01:57`
        (the elapsed time last: the first part a narrow terminal drops)."""
        parts = []
        if self.items is not None:
            name, size = self.items
            parts.append(f"{self.done // size}/{-(-self.total // size)} {name}")
        if self.unit == "B":
            parts.append(f"{_amount(self.done, 'B')} of {_amount(self.total, 'B')}")
        else:
            parts.append(f"{self.done}/{self.total} {self.unit}")
        if self.estimate:
            rate = self.rate()
            parts.append("-" if rate is None else f"{_amount(rate, self.unit)}/s")
            parts.append(f"left {clock(self.left())}")
        if elapsed:
            parts.append(f"elapsed {clock(self.elapsed())}")
        return "  ".join(parts)

    def describe(self, what: str) -> None:
        """Name the work's current phase (shown from the next refresh)."""
        self.what = what
        self._show(force=True)

    def begin(self, what: str) -> None:
        """The previous step is done (if any); `what` begins."""
        if self._begun:
            self.done = min(self.done + 1, self.total)
        self._begun = True
        self.describe(what)

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        self._show(force=self.done >= self.total)

    def _show(self, force: bool = False) -> None:
        if not self.enabled or self.elapsed() < self.after_s:
            return
        if self.console.is_terminal:
            if self._live is None:
                self._live = Live(_Line(self), console=self.console, refresh_per_second=4,
                                  transient=True)
                self._live.start()
            return
        now = self._clock()
        if force or self._last_line is None or now - self._last_line >= self.every_s:
            self._last_line = now
            self.console.print(f"{self.what}: {self.status()}", markup=False,
                               highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def __enter__(self) -> WorkProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class _Line:
    """The rich line: what, a bar over the rest of the width, the status; on a narrow
    terminal no bar, then no elapsed time."""

    def __init__(self, progress: WorkProgress) -> None:
        self.progress = progress

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        p = self.progress
        status = p.status()
        width = options.max_width - len(p.what) - len(status) - 4
        if width < 10:
            line = f"{p.what}  {status}"
            if len(line) > options.max_width:
                line = f"{p.what}  {p.status(elapsed=False)}"
            yield Text(line, no_wrap=True, overflow="ellipsis")
            return
        grid = Table.grid(padding=(0, 2, 0, 0))
        grid.add_row(Text(p.what, no_wrap=True),
                     ProgressBar(total=max(p.total, 1), completed=p.done, width=width),
                     Text(status, no_wrap=True))
        yield grid
