"""`trainer.profile` and the memory figures (R-OPS-2, R-OPS-3): a trace per rank, the top
operators on rank 0, no second profile on resume unless asked, each rank's peak memory, the
time split, the out-of-memory message, and `validate-config`'s refusals."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from embodichain.core.observe.report import RunCurves, build_figure
from embodichain.core.observe.time_split_plot import draw_time_split
from embodichain.core.runs.run_dir import read_metrics
from embodichain.core.training import memory, time_split
from tests.support import (
    CPU_RECIPE,
    assert_ok,
    factories_env,
    run_cli,
    run_torchrun,
    write_recipe,
)
from tests.support.cli import invoke

PROFILED = {"trainer.max_updates": 6, "trainer.log_every": 2, "trainer.validate_every": 0,
            "trainer.save_every": 0, "trainer.profile": {"start": 2, "updates": 2}}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """PROFILED trained by 2 torchrun workers: the run directory and what it printed."""
    root = tmp_path_factory.mktemp("profiled")
    recipe = write_recipe(root / "r.yaml", root / "run", **PROFILED)
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", timeout=240)
    assert_ok(proc)
    return root / "run", proc.stdout + proc.stderr


def _spans(trace: Path) -> set[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return {e["name"] for e in events if isinstance(e, dict) and "name" in e}


def test_every_rank_writes_a_chrome_trace_of_the_window(two_ranks) -> None:
    """Catches a profile on rank 0 only, a trace that is not Chrome-trace JSON, and a window
    off by one (update 1 or 4 recorded, or update 3 missing)."""
    run, _ = two_ranks
    for rank in (0, 1):
        names = _spans(run / "profile" / f"rank_{rank}.2.pt.trace.json")
        assert {"update 2", "update 3"} <= names
        assert not {"update 1", "update 4"} & names
        assert any(n.startswith("aten::") for n in names)  # the operators themselves


def test_rank_zero_alone_writes_the_top_operators_and_says_where(two_ranks) -> None:
    """Catches a table per rank (or none), one not sorted by self time, and a table whose
    path the log does not give."""
    run, output = two_ranks
    assert sorted(p.name for p in (run / "profile").iterdir()) == [
        "rank_0.2.pt.trace.json", "rank_1.2.pt.trace.json", "top_operators.2.txt"]
    table = (run / "profile" / "top_operators.2.txt").read_text()
    assert "by self_cpu_time_total" in table and "Self CPU" in table
    assert str(run / "profile" / "top_operators.2.txt") in output


def test_each_ranks_peak_memory_and_the_time_split_are_in_every_line(two_ranks) -> None:
    """Catches rank 0's peak alone (rank 1's slot empty), `memory/peak` other than the
    largest, a line without the split, and a summary without the memory row."""
    run, output = two_ranks
    lines = [r for r in read_metrics(run / "metrics.jsonl").records if "train/loss" in r]
    assert [r["step"] for r in lines] == [2, 4, 6]
    for record in lines:
        peaks = [record["memory/peak_rank_0"], record["memory/peak_rank_1"]]
        assert min(peaks) > 2**20 and record["memory/peak"] == max(peaks)
        split = [record[f"time/split/{p}"] for p in time_split.PHASES]
        assert min(split) >= 0 and record["time/split/forward_backward"] > 0
    assert "memory" in output and "rank 0 " in output and "rank 1 " in output


def test_a_resumed_run_profiles_again_only_when_asked(tmp_path: Path) -> None:
    """Catches a resume past the window that profiles (and overwrites) again, and a
    `--set trainer.profile.start` on resume that is ignored; also the CPU warning of
    `memory_snapshot` (no allocator there)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**PROFILED, "trainer.max_updates": 4,
                             "trainer.memory_snapshot": True})
    first = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert_ok(first)
    assert "allocator snapshot exists for CUDA only" in first.stderr + first.stdout
    profile = tmp_path / "run" / "profile"
    before = {p.name: p.read_bytes() for p in profile.iterdir()}
    assert set(before) == {"rank_0.2.pt.trace.json", "top_operators.2.txt"}
    again = run_cli("resume", str(tmp_path / "run"), "--set", "trainer.max_updates=6",
                    "--no-progress")
    assert_ok(again)
    assert {p.name: p.read_bytes() for p in profile.iterdir()} == before
    assert "no profile" in again.stdout + again.stderr
    asked = run_cli("resume", str(tmp_path / "run"), "--set", "trainer.max_updates=8",
                    "--set", "trainer.profile.start=7", "--no-progress")
    assert_ok(asked)
    assert {"update 7", "update 8"} <= _spans(profile / "rank_0.7.pt.trace.json")
    assert (profile / "top_operators.7.txt").is_file()


def test_out_of_memory_ends_with_the_figures_and_the_knobs(tmp_path: Path) -> None:
    """Catches torch's bare traceback at an out-of-memory error, and a message without the
    update, the peak or the settings that lower it."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**PROFILED, "factory": "exhausting:build_supervised_trainer",
                             "trainer.profile": None})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   env=factories_env(EMBODICHAIN_TEST_OOM_AT="3"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    output = proc.stdout + proc.stderr
    assert "out of memory on cpu in update 3 (peak " in output
    for knob in ("trainer.batch_size", "trainer.global_batch_size", "trainer.precision",
                 "trainer.activation_checkpointing"):
        assert knob in output, knob


def test_the_cuda_message_gives_the_peak_the_total_and_the_snapshot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the device's total or this rank's peak left out on CUDA, and a snapshot
    written but not named."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 78 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=80 * 2**30))
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\n"
                                   "Of the allocated memory")
    text = memory.out_of_memory_message(error, torch.device("cuda", 0), 41,
                                        Path("RUN/memory/rank_0.oom_update_42.pickle"))
    assert "update 42" in text and "peak 78.00 GiB allocated of the device's 80.00 GiB" in text
    assert "Tried to allocate 2.00 GiB." in text and "Of the allocated" not in text
    assert "RUN/memory/rank_0.oom_update_42.pickle" in text and "\n" not in text
    without = memory.out_of_memory_message(error, torch.device("cuda", 0), 41)
    assert without.endswith("trainer.memory_snapshot: true writes the allocator's snapshot")


@pytest.mark.parametrize(("setting", "says"), [
    ("trainer.profile.start=6", "trainer.profile: updates 6..8 run past"),
    ("trainer.profile.updates=0", "trainer.profile.updates"),
    ("trainer.profile.every=2", "trainer.profile.every: unknown key"),
])
def test_validate_config_refuses_a_profile_that_cannot_run(tmp_path: Path, setting: str,
                                                           says: str) -> None:
    """Catches a window past max_updates accepted (it would never be written), an empty
    window, and an unknown key."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**PROFILED, "trainer.profile": {"start": 2, "updates": 3}})
    result = invoke("validate-config", str(recipe), "--set", setting)
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert not (tmp_path / "run").exists()


def test_the_split_counts_loads_inside_the_update_once(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """Catches a micro-batch load inside the update counted both as data wait and as
    forward-backward, and `other` that is not the rest of the wall time."""
    clock = iter([0.0, 1.0, 3.0, 4.0, 5.0])
    monkeypatch.setattr(time_split.time, "perf_counter", lambda: next(clock))
    split = time_split.TimeSplit(torch.device("cpu"))  # 0.0
    split.begin()  # 1.0
    split.backward_done()  # 3.0
    split.end(data=0.5, inside=0.2)  # 4.0
    assert split.metrics() == pytest.approx({  # 5.0
        "time/split/data": 0.5, "time/split/forward_backward": 1.8, "time/split/step": 1.0,
        "time/split/other": 1.7})


def test_report_stacks_the_split_at_each_logged_update() -> None:
    """Catches phases drawn side by side or over each other instead of stacked, a run
    without the split given an empty panel, and a long run drawn as thousands of slivers."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    split = {"time/split/data": 0.1, "time/split/forward_backward": 0.2,
             "time/split/step": 0.3, "time/split/other": 0.4}
    runs = [RunCurves(Path("a"), "a", {}, [{"step": s, "train/loss": 1.0, **split}
                                           for s in (10, 20)]),
            RunCurves(Path("b"), "b", {}, [{"step": 10, "train/loss": 1.0}])]
    fig = build_figure(runs)
    panels = {ax.get_title(): ax for ax in fig.axes if ax.get_visible()}
    assert set(panels) == {"train/loss", "a: seconds per update"}
    bars = [p for p in panels["a: seconds per update"].patches if p.get_gid() == "other"]
    assert [round(b.get_y(), 6) for b in bars] == [0.6, 0.6]  # on top of the other three
    assert [round(b.get_height(), 6) for b in bars] == [0.4, 0.4]
    plt.close(fig)
    long = RunCurves(Path("c"), "c", {}, [{"step": s, **split, "time/split/other": s % 2}
                                          for s in range(1, 1001)])
    fig, ax = plt.subplots()
    draw_time_split(ax, long, most=100)  # ten lines a bar, their mean
    bars = [p for p in ax.patches if p.get_gid() == "other"]
    assert len(bars) == 100 and {round(b.get_height(), 6) for b in bars} == {0.5}
    plt.close(fig)


def test_recipe_example_accepts_a_profile() -> None:
    """Catches the new keys refused in the example recipe (a typo in the schema)."""
    result = invoke("validate-config", str(CPU_RECIPE), "--set", "trainer.profile.start=5",
                    "--set", "trainer.memory_snapshot=true")
    assert result.exit_code == 0, result.output
