"""`report`'s panel of where an update's time goes (R-OPS-2): at each logged update a bar of
the seconds per update since the line before, stacked by phase (`time/split/*`: data wait,
forward and backward, the optimizer step, everything else). One panel per run that logged
the split. Imports no torch; drawing is report.py's (matplotlib)."""

from __future__ import annotations

from typing import Any, Protocol

PHASES = {"data": "data wait", "forward_backward": "forward + backward",
          "step": "optimizer step", "other": "logging, saves, validation"}
MOST_BARS = 200  # more would be slivers; matplotlib also draws each one


class Run(Protocol):
    label: str

    def series(self, key: str) -> tuple[list[int], list[float]]: ...


def has_time_split(run: Run) -> bool:
    return bool(run.series("time/split/forward_backward")[0])


def draw_time_split(ax: Any, run: Run, most: int = MOST_BARS) -> None:
    """The run's split as stacked bars on `ax`, one per logged update; a long run's lines
    are averaged in consecutive groups, at most `most` bars (each at its group's last
    update)."""
    columns = {phase: dict(zip(*run.series(f"time/split/{phase}"), strict=True))
               for phase in PHASES}
    steps = sorted(set().union(*(c.keys() for c in columns.values())))
    if len(steps) > most:
        groups = [steps[i * len(steps) // most:(i + 1) * len(steps) // most]
                  for i in range(most)]
        columns = {phase: {g[-1]: sum(c.get(s, 0.0) for s in g) / len(g) for g in groups}
                   for phase, c in columns.items()}
        steps = [g[-1] for g in groups]
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    width = 0.8 * (min(gaps) if gaps else 1)
    bottom = [0.0] * len(steps)
    for phase, label in PHASES.items():
        heights = [columns[phase].get(step, 0.0) for step in steps]
        ax.bar(steps, heights, width=width, bottom=bottom, label=label, gid=phase)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_title(f"{run.label}: seconds per update")
    ax.set_xlabel("update")
    ax.legend(fontsize="small", loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
