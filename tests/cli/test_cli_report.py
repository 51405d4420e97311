"""`embodichain report` (R-OBS-1): PNG and HTML drawn from the runs' own files."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy
from conftest import assert_ok, run_cli, worker_env, write_recipe

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


def test_png_follows_the_data(tmp_path: Path, sl_ddp_one_process: Path,
                              sl_ddp_two_workers: Path, copy_run) -> None:
    both = report(str(sl_ddp_one_process), str(sl_ddp_two_workers), cwd=tmp_path)
    one = report(str(sl_ddp_one_process), cwd=tmp_path)
    assert both.startswith(PNG_MAGIC) and one.startswith(PNG_MAGIC)
    assert both != one
    assert pixels(both).shape == pixels(one).shape  # same panels, different lines
    assert not numpy.array_equal(pixels(both), pixels(one))
    # Two more validation keys: two more panels, so a taller image.
    more = copy_run(sl_ddp_one_process, "more")
    with open(more / "metrics.jsonl", "a") as f:
        for step in (50, 100):
            f.write(json.dumps({"step": step, "validation/rollout_mse": 1.0 / step,
                                "validation/baseline_mse": 0.5}) + "\n")
    taller = report(str(more), cwd=tmp_path)
    assert pixels(taller).shape[0] > pixels(one).shape[0]
    assert pixels(taller).shape[1] == pixels(one).shape[1]


def test_resumed_run_marks_the_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 100})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    assert_ok(run_cli("resume", str(run), "--set", "trainer.max_updates=200", "--no-progress"))
    events = json.loads((run / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events] == [("resumed", 100)]
    marked = report(str(run), cwd=tmp_path)
    # The same run without its event, under the same label (directory name and run id).
    same_name = tmp_path / "x" / "run"
    shutil.copytree(run, same_name)
    data = json.loads((same_name / "run.json").read_text())
    data["events"] = []
    (same_name / "run.json").write_text(json.dumps(data))
    unmarked = report(str(same_name), cwd=tmp_path)
    assert marked != unmarked
    assert not numpy.array_equal(pixels(marked), pixels(unmarked))


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
    assert "pip install 'embodichain[plot]'" in proc.stderr
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
