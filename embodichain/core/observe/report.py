"""Curves of one or more runs (R-OBS-1): `train/loss`, every other `train/*` key, every
`validation/*` key, the learning rate and the share of time waiting for data
(`time/data_wait_max`) against the update, one line per run, resume and roll-back points
marked; a success rate (`validation/*_rate`) is shaded with its Wilson 95% interval over the
recipe's `evaluation.episodes` (R-TRUST-3); then each run's time split as stacked bars
(R-OPS-2). A panel is on a log axis only when its values are positive and span more than
two decades; otherwise linear (an accuracy, a loss that barely moves).

Reads only run.json and metrics.jsonl (no torch). Drawing needs matplotlib, the optional
extra `plot`; its absence is a usage error that names the install command.
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodichain.core.errors import UsageError
from embodichain.core.evaluation.intervals import successes_of, wilson_interval
from embodichain.core.observe.time_split_plot import draw_time_split, has_time_split
from embodichain.core.runs.best_record import run_best
from embodichain.core.runs.run_dir import METRICS, RUN_JSON, read_metrics, read_run_json

PLOT_HINT = "pip install 'embodichain-sl[plot]'"
MARKED_EVENTS = {"resumed": "--", "rolled_back": ":"}  # run.json event -> line style


@dataclass
class RunCurves:
    """One run as the report shows it."""

    directory: Path
    label: str
    identity: dict[str, Any]
    records: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def episodes(self) -> int | None:
        """Episodes per closed-loop evaluation (the recipe's `evaluation.episodes`), the n
        of every `validation/*_rate`; None without an evaluation section."""
        section = (self.identity.get("config") or {}).get("evaluation") or {}
        n = section.get("episodes", 50 if section else None)  # the section's default
        return n if isinstance(n, int) and n > 0 else None

    def interval(self, key: str, value: float) -> tuple[float, float] | None:
        """The Wilson 95% interval of a success rate `key` at `value` (R-TRUST-3); None
        for another metric or where the episode count is unknown."""
        n = self.episodes
        if not (key.startswith("validation/") and key.endswith("_rate")) or n is None:
            return None
        return wilson_interval(min(n, successes_of(value, n)), n)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], float(r[key])) for r in self.records
                  if key in r and isinstance(r.get("step"), int)
                  and isinstance(r[key], int | float) and not isinstance(r[key], bool)]
        return [s for s, _ in points], [v for _, v in points]


def load_runs(directories: list[Path]) -> list[RunCurves]:
    """Read each run directory; labels are the shortest unique path tails plus a short id."""
    runs = []
    for directory in directories:
        if not (directory / RUN_JSON).is_file() and not (directory / METRICS).is_file():
            raise UsageError(f"{directory} is not a run directory (no {RUN_JSON} or {METRICS})")
        identity = read_run_json(directory) or {}
        events = [e for e in identity.get("events") or [] if isinstance(e, dict)]
        runs.append(RunCurves(directory, "", identity, read_metrics(directory / METRICS).records,
                              events))
    names = _unique_tails([run.directory for run in runs])
    for run, name in zip(runs, names, strict=True):
        run_id = run.identity.get("run_id")
        run.label = f"{name} ({run_id[:8]})" if run_id else name
    return runs


def _unique_tails(paths: list[Path]) -> list[str]:
    parts = [path.resolve().parts for path in paths]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        tails = ["/".join(p[-depth:]) for p in parts]
        if len(set(tails)) == len(tails):
            return tails
    return [str(path) for path in paths]  # the same directory twice


def plotted_keys(runs: list[RunCurves]) -> list[str]:
    """train/loss, every other train/* key, every validation/* key (the runs' best metrics
    first), train/lr, then the slowest rank's share of time waiting for data."""
    keys = {k for run in runs for r in run.records for k in r}
    chosen = {run_best(run.identity).metric for run in runs}
    train = sorted(k for k in keys if k.startswith("train/") and k not in ("train/loss",
                                                                          "train/lr"))
    validation = sorted((k for k in keys if k.startswith("validation/")),
                        key=lambda k: (k not in chosen, k))
    return [k for k in ["train/loss", *train, *validation, "train/lr", "time/data_wait_max"]
            if k in keys]


def log_scale(values: list[float]) -> bool:
    """A log axis only for positive values spanning more than two decades."""
    return bool(values) and min(values) > 0 and max(values) / min(values) > 100


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(f"report draws with matplotlib, which is not installed: {PLOT_HINT}") \
            from None
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def render_png(runs: list[RunCurves]) -> bytes:
    """The curves as one PNG (see `build_figure`)."""
    plt = _pyplot()
    fig = build_figure(runs)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def build_figure(runs: list[RunCurves]) -> Any:
    """The curves as a matplotlib figure: a panel per key (titled by it), a line per run,
    events as vertical lines (`gid` names the event). The caller closes it; render_png
    rasterises it, tests read what it draws."""
    plt = _pyplot()
    from matplotlib.lines import Line2D

    keys = plotted_keys(runs)
    if not keys:
        raise UsageError("nothing to draw: no train/loss, validation/* or train/lr records in "
                         + ", ".join(str(run.directory) for run in runs))
    split_runs = [run for run in runs if has_time_split(run)]  # a stacked bar panel each
    panels = len(keys) + len(split_runs)
    cols = 1 if panels == 1 else 2
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.4 * rows + 0.8), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key in zip(axes.flat, keys, strict=False):
        plotted: list[float] = []
        for i, run in enumerate(runs):
            steps, values = run.series(key)
            if not steps:
                continue
            color = colors[i % len(colors)]
            ax.plot(steps, values, color=color, label=run.label,
                    marker="o" if len(steps) <= 12 else None, markersize=3)
            plotted += values
            bands = [run.interval(key, v) for v in values]
            if all(bands):  # a success rate: its Wilson 95% interval, shaded
                ax.fill_between(steps, [b[0] for b in bands], [b[1] for b in bands],
                                color=color, alpha=0.15, linewidth=0, gid="wilson95")
            for event in run.events:
                style = MARKED_EVENTS.get(event.get("event"))
                if style and isinstance(event.get("step"), int):
                    # A roll-back and the resume after it share their update: the roll-back
                    # is drawn wider beneath the resume's line, so both stay visible.
                    wide = event.get("event") == "rolled_back"
                    ax.axvline(event["step"], color=color, linestyle=style,
                               linewidth=3.0 if wide else 1.0, alpha=0.6 if wide else 1.0,
                               zorder=1 if wide else 2, gid=event.get("event"))
        if log_scale(plotted):
            ax.set_yscale("log")
        ax.set_title(key)
        ax.set_xlabel("update")
        ax.grid(True, alpha=0.3)
    for ax, run in zip(list(axes.flat)[len(keys):], split_runs, strict=False):
        draw_time_split(ax, run)
    for ax in list(axes.flat)[panels:]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=colors[i % len(colors)], label=run.label)
               for i, run in enumerate(runs)]
    shown = {e.get("event") for run in runs for e in run.events} & set(MARKED_EVENTS)
    handles += [Line2D([], [], color="gray", linestyle=MARKED_EVENTS[name],
                       label=name.replace("_", " ")) for name in sorted(shown)]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 4), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / fig.get_figheight()))
    return fig


def _last(run: RunCurves, key: str) -> str:
    steps, values = run.series(key)
    return f"{values[-1]:.6g} (update {steps[-1]})" if steps else "-"


def _metric_text(run: RunCurves) -> str:
    """The run's own best metric (R-MET-1): its last value and its best, by its direction."""
    best = run_best(run.identity)
    steps, values = run.series(best.metric)
    found = best.best_of(zip(steps, values, strict=True))
    if found is None:
        return f"{best.metric}: -"
    band = run.interval(best.metric, found[0])
    within = f", 95% interval {band[0]:.3f}-{band[1]:.3f}" if band else ""
    return (f"{best.metric} ({best.mode}): {_last(run, best.metric)}, best {found[0]:.6g} "
            f"(update {found[1]}{within})")


def render_html(runs: list[RunCurves], png: bytes) -> str:
    """One self-contained page: the runs' identities as a table and the figure inline."""
    e = html.escape
    head = ["run", "directory", "run id", "factory", "world size", "created", "config sha256",
            "last train/loss", "best metric: last, best", "resumed from", "events"]
    rows = []
    for run in runs:
        ident = run.identity
        resumed = ident.get("resumed_from") or {}
        resumed_text = (f"{str(resumed.get('run_id', ''))[:12]} at update {resumed.get('step')}"
                        if resumed else "-")
        events = "; ".join(f"{ev.get('event')} at update {ev.get('step')}" for ev in run.events)
        cells = [run.label, str(run.directory), ident.get("run_id") or "-",
                 ident.get("factory") or "-", ident.get("world_size", "-"),
                 ident.get("created_at") or "-", str(ident.get("config_sha256") or "-")[:16],
                 _last(run, "train/loss"), _metric_text(run), resumed_text,
                 events or "-"]
        rows.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
    image = base64.b64encode(png).decode("ascii")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<title>embodichain report</title>\n<style>body{font-family:sans-serif;margin:2em}"
        "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:left}img{max-width:100%}</style>\n</head>\n<body>\n"
        f"<h1>embodichain report</h1>\n<p>{len(runs)} run(s), generated {e(now)}. Dashed "
        "lines: resumed; dotted: rolled back.</p>\n"
        "<table>\n<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>\n"
        + "\n".join(rows) + "\n</table>\n"
        f"<p><img alt=\"curves of {e(', '.join(run.label for run in runs))}\" "
        f"src=\"data:image/png;base64,{image}\"></p>\n</body>\n</html>\n"
    )
