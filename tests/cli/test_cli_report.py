"""`embodichain report` (R-OBS-1): PNG and HTML drawn from the runs' own files."""

from __future__ import annotations

import base64
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy

from tests.support import assert_ok, run_cli, worker_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def pixels(data: bytes) -> numpy.ndarray:
    import io

    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(data), format="png")


def report(*args: str, cwd: Path) -> bytes:
    out = cwd / "out.png"
    out.unlink(missing_ok=True)
    assert_ok(run_cli("report", *args, "--out", str(out), cwd=cwd))
    return out.read_bytes()


def split_panels(directories: list[Path]) -> list[str]:
    """The titles of the panels with bars (each run's time split)."""
    import matplotlib.pyplot as plt

    from embodichain.core.observe.report import build_figure, load_runs

    fig = build_figure(load_runs(directories))
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible() and ax.patches]
    plt.close(fig)
    return titles


def drawn(directories: list[Path]) -> dict[str, dict[str, object]]:
    """What render_png draws for these runs, read from the figure it rasterises:
    panel title -> {"curves": {label: (steps, values)}, "marks": sorted x of vertical lines}."""
    import matplotlib.pyplot as plt

    from embodichain.core.observe.report import build_figure, load_runs

    fig = build_figure(load_runs(directories))
    panels: dict[str, dict[str, object]] = {}
    try:
        for ax in fig.axes:
            if not ax.get_visible() or ax.patches:  # the time split's bars: no curves
                continue
            curves, marks = {}, []
            for line in ax.lines:
                xs, ys = list(line.get_xdata()), list(line.get_ydata())
                if len(xs) == 2 and xs[0] == xs[1] and ys == [0, 1]:  # axvline: axes coords
                    marks.append(xs[0])
                else:
                    assert line.get_label() not in curves, f"{ax.get_title()}: two lines"
                    curves[line.get_label()] = ([int(x) for x in xs], [float(y) for y in ys])
            panels[ax.get_title()] = {"curves": curves, "marks": sorted(marks)}
    finally:
        plt.close(fig)
    return panels


def expected_curves(directories: list[Path], key: str) -> dict[str, tuple[list, list]]:
    """label -> (steps, values) of `key` in each run's metrics.jsonl, for runs that have it."""
    from embodichain.core.observe.report import load_runs

    curves = {}
    for run in load_runs(directories):
        steps, values = run.series(key)
        if steps:
            curves[run.label] = (steps, values)
    return curves


def test_png_follows_the_data(tmp_path: Path, sl_ddp_one_process: Path,
                              sl_ddp_two_workers: Path, copy_run) -> None:
    """Each panel draws one line per run with exactly that run's steps and values. Catches
    a run left undrawn (e.g. only the first run's curve: the legend alone still lists every
    run), a curve from the wrong run or key, and a panel missing for a recorded key."""
    both = [sl_ddp_one_process, sl_ddp_two_workers]
    panels = drawn(both)
    assert len(split_panels(both)) == 2  # and each run's time split, as bars
    assert {"train/loss", "validation/mse", "train/lr"} <= set(panels)
    for key, panel in panels.items():
        assert panel["curves"] == expected_curves(both, key), key
        assert len(panel["curves"]) == 2, key  # both runs record every plotted key
        assert panel["marks"] == []  # neither run was resumed or rolled back
    # The PNG is that figure, rasterised.
    png = report(*map(str, both), cwd=tmp_path)
    assert png.startswith(PNG_MAGIC) and pixels(png).size > 0
    # Two more validation keys, in one run only: their panels draw that run alone.
    more = copy_run(sl_ddp_one_process, "more")
    with open(more / "metrics.jsonl", "a") as f:
        for step in (50, 100):
            f.write(json.dumps({"step": step, "validation/rollout_mse": 1.0 / step,
                                "validation/baseline_mse": 0.5}) + "\n")
    panels = drawn([more, sl_ddp_two_workers])
    for key in ("validation/rollout_mse", "validation/baseline_mse"):
        curves = panels[key]["curves"]
        assert curves == expected_curves([more, sl_ddp_two_workers], key)
        assert [steps for steps, _ in curves.values()] == [[50, 100]]


def test_resumed_run_marks_the_resume(tmp_path: Path, resumed_at_100: Path, copy_run) -> None:
    """Every panel marks each resume and roll-back of run.json with a vertical line at its
    update, per run, over that run's whole curve. Catches the marks not drawn (e.g. no
    `ax.axvline`: the legend entry alone still changes the image), drawn at the wrong update
    or for only one run, and a resumed run drawn as two curves or only its last part."""
    run = resumed_at_100 / "run"  # trained to 100, then resumed in place to 200 (conftest)
    events = json.loads((run / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events] == [("resumed", 100)]
    panels = drawn([run])
    for key, panel in panels.items():
        assert panel["curves"] == expected_curves([run], key), key
        (steps, _), = panel["curves"].values()
        assert steps[0] < 100 < steps[-1] == 200, key  # one curve across the resume
        assert panel["marks"] == [100], key
    # A second run, rolled back at 150 and resumed there, beside it: its own marks too.
    other = copy_run(run, "other")
    data = json.loads((other / "run.json").read_text())
    data["events"] += [{"event": "rolled_back", "step": 150, "records": 3},
                       {"event": "resumed", "step": 150}]
    (other / "run.json").write_text(json.dumps(data))
    panels = drawn([run, other])
    for key, panel in panels.items():
        assert len(panel["curves"]) == 2, key
        assert panel["marks"] == [100, 100, 150, 150], key
    png = report(str(run), str(other), cwd=tmp_path)
    assert png.startswith(PNG_MAGIC)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_html_is_one_self_contained_page(tmp_path: Path, sl_ddp_one_process: Path,
                                         sl_ddp_two_workers: Path) -> None:
    out = tmp_path / "report.html"
    assert_ok(run_cli("report", str(sl_ddp_one_process), str(sl_ddp_two_workers),
                      "--format", "html", "--out", str(out), cwd=tmp_path))
    page = _Page()
    page.feed(out.read_text())
    page.close()
    assert len(page.images) == 1
    prefix = "data:image/png;base64,"
    assert page.images[0].startswith(prefix)
    png = base64.b64decode(page.images[0][len(prefix):], validate=True)
    assert png.startswith(PNG_MAGIC) and pixels(png).size > 0
    header, *rows = page.rows
    assert "run id" in header and "world size" in header
    ids = {json.loads((r / "run.json").read_text())["run_id"]: r
           for r in (sl_ddp_one_process, sl_ddp_two_workers)}
    assert {row[header.index("run id")] for row in rows} == set(ids)
    for row in rows:
        run = ids[row[header.index("run id")]]
        world = json.loads((run / "run.json").read_text())["world_size"]
        assert row[header.index("world size")] == str(world)


def test_without_matplotlib_it_names_the_extra(tmp_path: Path, sl_ddp_one_process: Path
                                               ) -> None:
    fake = tmp_path / "site"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text(
        "raise ImportError('No module named matplotlib (simulated)')\n")
    out = tmp_path / "r.png"
    proc = run_cli("report", str(sl_ddp_one_process), "--out", str(out), cwd=tmp_path,
                   env=worker_env(PYTHONPATH=str(fake)))
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'embodichain-sl[plot]'" in proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr
    assert not out.exists()


def test_not_a_run_directory_and_no_torch(tmp_path: Path, sl_ddp_one_process: Path) -> None:
    proc = run_cli("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "is not a run directory" in proc.stderr
    probe = (
        "import sys\nfrom typer.testing import CliRunner\nfrom embodichain.cli import app\n"
        f"r = CliRunner().invoke(app, ['report', {str(sl_ddp_one_process)!r}, '--out', "
        f"{str(tmp_path / 'p.png')!r}])\n"
        "assert r.exit_code == 0, r.output\nprint('torch' in sys.modules)\n")
    import subprocess

    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=worker_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
