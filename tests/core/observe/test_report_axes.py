"""`report`'s figure before rasterising (R-OBS-1, R-MET-1): which panels, which axis
scale, and marks that stay visible; its run table names each run's own best metric."""

from __future__ import annotations

from pathlib import Path

import pytest

from embodichain.core.observe.report import RunCurves, build_figure, plotted_keys, render_html

pytest.importorskip("matplotlib")


def _run(records: list[dict], events: list[dict] | None = None, best: dict | None = None
         ) -> RunCurves:
    identity = {"run_id": "abcdef0123456789", "best": best} if best else {"run_id": "abcdef01"}
    return RunCurves(Path("run"), "run", identity, records, events or [])


def _panels(runs: list[RunCurves]):
    fig = build_figure(runs)
    return fig, {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}


def test_linear_unless_positive_over_more_than_two_decades() -> None:
    """Catches an accuracy (or any positive metric) drawn on a log axis, and a loss that
    falls by decades drawn linearly."""
    import matplotlib.pyplot as plt

    records = [{"step": s, "train/loss": 10.0 ** -(s / 50), "validation/accuracy": 0.5 + s / 1000,
                "validation/loss": 1.0 + s / 1000, "train/lr": 0.001,
                "validation/shift": s - 100.0} for s in range(10, 210, 10)]
    fig, panels = _panels([_run(records)])
    assert panels["train/loss"].get_yscale() == "log"  # 10^-0.2 .. 10^-4.2
    for key in ("validation/accuracy", "validation/loss", "train/lr", "validation/shift"):
        assert panels[key].get_yscale() == "linear", key
    plt.close(fig)


def test_every_train_metric_is_drawn_and_the_best_metric_first() -> None:
    """Catches train/* metrics other than loss and lr left out (train/accuracy), and a
    validation order that puts validation/mse first whatever the run's metric."""
    records = [{"step": s, "train/loss": 1.0, "train/accuracy": 0.5, "train/lr": 0.1,
                "validation/accuracy": 0.7, "validation/mse": 0.3} for s in (10, 20)]
    run = _run(records, best={"metric": "validation/accuracy", "mode": "max"})
    assert plotted_keys([run]) == ["train/loss", "train/accuracy", "validation/accuracy",
                                   "validation/mse", "train/lr"]


def test_a_roll_back_mark_stays_visible_beside_a_resume_at_the_same_update() -> None:
    """Catches the resume's dashed line drawn over the roll-back's dotted one of the same
    colour and width at the same update (the roll-back would vanish)."""
    import matplotlib.pyplot as plt

    records = [{"step": s, "train/loss": 1.0 / s} for s in range(10, 110, 10)]
    events = [{"event": "rolled_back", "step": 50}, {"event": "resumed", "step": 50}]
    fig, panels = _panels([_run(records, events)])
    marks = {line.get_gid(): line for line in panels["train/loss"].lines if line.get_gid()}
    back, resumed = marks["rolled_back"], marks["resumed"]
    assert list(back.get_xdata()) == list(resumed.get_xdata()) == [50, 50]
    # Beneath and wider: it shows on both sides of the resume's line.
    assert back.get_linewidth() > 2 * resumed.get_linewidth()
    assert back.get_zorder() < resumed.get_zorder()
    assert back.get_linestyle() != resumed.get_linestyle()
    plt.close(fig)


def test_the_run_table_names_each_runs_own_metric() -> None:
    """Catches a table column that only knows validation/mse (`-` for an accuracy run) or
    calls the lowest accuracy the best."""
    records = [{"step": 10, "validation/accuracy": 0.75}, {"step": 20, "validation/accuracy": 0.5}]
    page = render_html([_run(records, best={"metric": "validation/accuracy", "mode": "max"})],
                       b"")
    assert "validation/accuracy (max): 0.5 (update 20), best 0.75 (update 10)" in page


def test_a_success_rate_carries_its_wilson_interval() -> None:
    """R-TRUST-3: a `validation/*_rate` panel is shaded with the Wilson 95% interval over
    the recipe's `evaluation.episodes` (46/50 at update 20: 0.812-0.968), the table's best
    names it; a loss gets none. Catches a rate drawn as if exact, and an interval over
    another count of episodes."""
    import matplotlib.pyplot as plt

    from embodichain.core.evaluation.intervals import wilson_interval

    records = [{"step": 10, "validation/success_rate": 0.5, "validation/loss": 1.0},
               {"step": 20, "validation/success_rate": 0.92, "validation/loss": 0.5}]
    run = _run(records, best={"metric": "validation/success_rate", "mode": "max"})
    run.identity["config"] = {"evaluation": {"episodes": 50}}
    fig, panels = _panels([run])
    bands = [c for c in panels["validation/success_rate"].collections
             if c.get_gid() == "wilson95"]
    assert len(bands) == 1
    ys = bands[0].get_paths()[0].vertices[:, 1]
    low, high = wilson_interval(46, 50)
    assert min(ys) == pytest.approx(wilson_interval(25, 50)[0]) and max(ys) == pytest.approx(high)
    assert any(y == pytest.approx(low) for y in ys)
    assert not [c for c in panels["validation/loss"].collections if c.get_gid() == "wilson95"]
    plt.close(fig)
    page = render_html([run], b"")
    assert "best 0.92 (update 20, 95% interval 0.812-0.968)" in page
