"""Rank-0 progress: a rich bar on a terminal, plain periodic lines otherwise (R-UX-1)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from embodichain.core.recipe.best import DEFAULT_BEST

log = logging.getLogger("embodichain")


def configure_logging(rank: int) -> None:
    """Rank 0 logs info; other ranks only warnings and errors, prefixed with their rank."""
    handler = logging.StreamHandler(sys.stderr)
    prefix = "" if rank == 0 else f"[rank {rank}] "
    handler.setFormatter(logging.Formatter(prefix + "%(levelname)s: %(message)s"
                                           if rank else "%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False
    if rank:
        # Python warnings (e.g. from torch) get the same rank prefix on the other ranks.
        logging.captureWarnings(True)
        warnings_log = logging.getLogger("py.warnings")
        warnings_log.handlers[:] = [handler]
        warnings_log.propagate = False


def clock(seconds: float | None) -> str:
    """`H:MM:SS` (fixed width below 100 hours), `-:--:--` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0 or seconds == float("inf"):
        return "-:--:--"
    seconds = int(seconds)
    if seconds >= 100 * 3600:
        return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _number(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.4g}"


class ProgressLine:
    """One status line that fits the console width, its parts in order of importance.

    Always: `update N/total`, `loss`, the best metric (`val_mse`, ...), `eta`; then, while
    they fit, `elapsed`, the rate and a bar that takes the rest. Numbers are padded to fixed
    widths, so the layout (and the bar's width) stays put from one refresh to the next.
    """

    def __init__(self, reporter: ProgressReporter) -> None:
        self.reporter = reporter

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.render(options.max_width)

    def render(self, width: int) -> RenderableType:
        """The line for a console `width` cells wide."""
        r = self.reporter
        rate = r.rate(r.step)
        eta = (r.total - r.step) / rate if rate > 0 else None
        digits = len(str(r.total))
        counter = (f"update {r.step:>{digits}}/{r.total}" if digits <= 9
                   else f"update {r.step}/{r.total:.3g}")  # 10^18 planned: no 19-digit padding

        def essentials(pad: bool) -> list[str]:
            loss, val = _number(r.loss), _number(r.val)
            if pad:
                return [f"loss {loss:>9}", f"{r.label} {val:>9}", f"eta {clock(eta):>7}"]
            return [f"loss {loss}", f"{r.label} {val}", f"eta {clock(eta)}"]

        # Fixed-width fields first (a steady layout); unpadded only where nothing else fits.
        for pad, sep in ((True, "  "), (True, " "), (False, " ")):
            parts = essentials(pad)
            if len(sep.join([counter, *parts])) <= width:
                break

        def room(*more: str) -> int:
            return width - len(sep.join([counter, *parts, *more]))

        elapsed = f"elapsed {clock(r.elapsed()):>7}"
        if room(elapsed) >= 0:
            parts.append(elapsed)
        speed = f"{rate:>8.1f} upd/s"
        if room(speed) >= 20 + len(sep):  # the rate only where a bar still fits beside it
            parts.append(speed)
        if r.data_wait is not None:
            pace = f"{_number(r.examples_per_s):>7} ex/s data {r.data_wait:>4.0%}"
            if room(pace) >= 20 + len(sep):
                parts.append(pace)
        bar_width = room() - len(sep)
        rest = sep.join(parts)
        if bar_width < 10:  # no room for a useful bar: the numbers matter more
            return Text(sep.join([counter, rest]), no_wrap=True, overflow="ellipsis")
        grid = Table.grid(padding=(0, len(sep), 0, 0))
        grid.add_row(Text(counter, no_wrap=True),
                     ProgressBar(total=r.total, completed=r.step, width=bar_width),
                     Text(rest, no_wrap=True))
        return grid


class ProgressReporter:
    """Shows update N/total, loss, the best metric's last value, updates/s, examples/s and
    the slowest rank's share of time waiting for data, elapsed time and ETA. `label` names
    that metric (`val_accuracy` for `validation/accuracy`, R-MET-1)."""

    def __init__(self, total: int, start: int, enabled: bool, every: int,
                 console: Console | None = None, label: str = DEFAULT_BEST.label) -> None:
        self.total = total
        self.every = every
        self.console = console or Console(stderr=True)
        self.rich = enabled and self.console.is_terminal
        self.plain = enabled and not self.rich
        self.loss = float("nan")
        self.label = label
        self.val: float | None = None
        self.examples_per_s: float | None = None
        self.data_wait: float | None = None  # the slowest rank's share of time waiting
        self.step = start
        self._t0 = time.perf_counter()
        self._start = start
        self._live: Live | None = None
        if self.rich:
            self._live = Live(ProgressLine(self), console=self.console, refresh_per_second=4,
                              transient=False)
            self._live.start()

    def elapsed(self) -> float:
        """Seconds since this fit started (the `time/elapsed_s` metric)."""
        return time.perf_counter() - self._t0

    def rate(self, step: int) -> float:
        elapsed = time.perf_counter() - self._t0
        return (step - self._start) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, **values: Any) -> None:
        """Record the latest values; `loss` and `val` (the best metric) are optional."""
        self.step = step
        if "loss" in values:
            self.loss = values["loss"]
        if "val" in values:
            self.val = values["val"]
        if "data_wait" in values:
            self.examples_per_s, self.data_wait = values["examples_per_s"], values["data_wait"]
        if self._live is None and self.plain and not values \
                and (step % self.every == 0 or step == self.total):
            rate = self.rate(step)
            eta = (self.total - step) / rate if rate else None
            log.info("update %d/%d  %s  elapsed %s  eta %s", step, self.total,
                     self._status(step), clock(self.elapsed()), clock(eta))

    def _status(self, step: int) -> str:
        pace = ("" if self.data_wait is None else
                f"  {_number(self.examples_per_s)} ex/s  data wait {self.data_wait:.0%}")
        return (f"loss {_number(self.loss)}  {self.label} {_number(self.val)}  "
                f"{self.rate(step):.1f} upd/s{pace}")

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
