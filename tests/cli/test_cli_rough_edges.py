"""Rough edges a newcomer met in one walk-through (issue 17): a resumed run's total and bar,
hints that name the launch that fits, runs that fail before their first update, a factory
without schema, an objective without LossResult, tables at 80 columns, closed pipes,
warnings, `report`'s output file and `validate-config` on a read-only checkout."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import embodichain
from embodichain.core.observe.summary import summary_lines
from tests.support import (
    FACTORIES,
    assert_ok,
    run_cli,
    run_torchrun,
    snapshot_dir,
    start_python_module,
    worker_env,
    write_recipe,
)
from tests.support.cli import invoke

SMALL = {"trainer.max_updates": 20, "trainer.validate_every": 10, "trainer.save_every": 10,
         "trainer.log_every": 5}


def small_run(root: Path, name: str = "run", **changes: object) -> tuple[Path, Path]:
    recipe = write_recipe(root / f"{name}.yaml", root / name, **{**SMALL, **changes})
    return recipe, root / name


@pytest.mark.slow  # several training processes
def test_resume_with_more_updates_says_the_new_total_and_shows_the_last_validation(
        tmp_path: Path) -> None:
    """Catches the summary (and `runs`) taking the total from the recipe the run began with
    (`finished at update 30/20`), and the bar showing `val_mse -` after a resume although the
    checkpoint holds the last validation."""
    recipe, run = small_run(tmp_path)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    proc = run_cli("resume", str(run), "--set", "trainer.max_updates=30")  # plain bar lines
    assert_ok(proc)
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert f"run {run_id[:12]} finished at update 30/30" in proc.stdout, proc.stdout
    assert "/20" not in proc.stdout + proc.stderr
    bar = [line for line in proc.stderr.splitlines() if line.startswith("update ")]
    assert bar[0].startswith("update 25/30 ") and "val_mse -" not in bar[0], proc.stderr
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
            if "validation/mse" in line and json.loads(line)["step"] == 20][0]
    assert f"val_mse {last['validation/mse']:.4g} " in bar[0], (bar[0], last)
    row = json.loads(run_cli("runs", str(tmp_path), "--json").stdout)[0]
    assert (row["max_updates"], row["state"]) == (30, "finished")
    events = json.loads((run / "run.json").read_text())["events"]
    assert [e.get("max_updates") for e in events if e["event"] == "resumed"] == [30]


@pytest.mark.slow
def test_hints_and_the_world_size_refusal_name_the_launch_that_fits(tmp_path: Path) -> None:
    """Catches hints that name `embodichain resume DIR` (one process) for a 2-worker run,
    which that command then refuses for its world size, and a world-size refusal that does
    not say how to launch."""
    recipe, run = small_run(tmp_path, **{"trainer.max_updates": 4, "trainer.save_every": 2,
                                        "trainer.validate_every": 2})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress"))
    torchrun = f"torchrun --standalone --nproc-per-node=2 -m embodichain resume {run}"

    again = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert again.returncode == 2 and "already holds a run" in again.stderr
    assert torchrun in again.stderr, again.stderr
    warned = run_cli("validate-config", str(recipe))
    assert warned.returncode == 0 and torchrun in warned.stderr, warned.stderr

    before = snapshot_dir(run)
    one = run_cli("resume", str(run), "--set", "trainer.max_updates=6", "--no-progress")
    assert one.returncode == 2 and "world_size: checkpoint 2, this run 1" in one.stderr
    assert f"launch with OMP_NUM_THREADS=1 {torchrun}" in one.stderr, one.stderr
    fresh = run_cli("train-sl", "--config", str(recipe), "--resume", str(run / "step_2.pt"),
                    "--set", f"trainer.output_dir={tmp_path / 'fresh'}", "--no-progress")
    assert fresh.returncode == 2, fresh.stderr
    assert (f"--nproc-per-node=2 -m embodichain train-sl --config {recipe} --resume "
            f"{run / 'step_2.pt'}") in fresh.stderr, fresh.stderr
    assert snapshot_dir(run) == before and not (tmp_path / "fresh").exists()

    # The other way round: a 1-process run resumed by 2 self-launched workers.
    recipe1, run1 = small_run(tmp_path, "single", **{"trainer.max_updates": 2,
                                                    "trainer.save_every": 2})
    assert_ok(run_cli("train-sl", "--config", str(recipe1), "--no-progress"))
    two = run_cli("resume", str(run1), "--set", "trainer.max_updates=4", "--nproc-per-node",
                  "2", "--no-progress")
    assert two.returncode == 2, two.stderr
    # ... keeping the user's --set (a pasted command must make the same change)
    assert f"launch with embodichain resume {run1} --set trainer.max_updates=4;" \
        in two.stderr, two.stderr


def test_an_empty_output_dir_is_refused(tmp_path: Path) -> None:
    """Catches `--set trainer.output_dir=` training into the current directory."""
    recipe, _ = small_run(tmp_path)
    before = snapshot_dir(tmp_path)
    proc = run_cli("train-sl", "--config", str(recipe), "--set", "trainer.output_dir=",
                   "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and "trainer.output_dir" in proc.stderr
    assert snapshot_dir(tmp_path) == before and not (tmp_path / ".lock").exists()


def _fail_at_first_update(recipe: Path, output_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   "--set", f"trainer.output_dir={output_dir}",
                   env=worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_FAIL_AT="1"))


@pytest.mark.slow  # several training processes
def test_a_run_that_fails_before_its_first_update_leaves_nothing_in_its_way(
        tmp_path: Path) -> None:
    """Catches a failed first update leaving run.json behind (the same command is then
    refused: "already holds a run"), and a clean-up that removes what was there before."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "unused",
                          factory="interrupting:build_supervised_trainer", **SMALL)
    nested = tmp_path / "new" / "deeper" / "run"
    for _ in range(2):  # the same command fails the same way, not with "already holds"
        proc = _fail_at_first_update(recipe, nested)
        assert proc.returncode == 1, proc.stderr
        assert "simulated crash at update 1" in proc.stderr
        assert "before its first update" in proc.stderr
        assert not (tmp_path / "new").exists()  # every directory it created, gone

    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "keep.txt").write_text("my notes\n")
    (mine / "data.bin").write_bytes(b"\x00\x01")
    before = snapshot_dir(mine)
    proc = _fail_at_first_update(recipe, mine)
    assert proc.returncode == 1, proc.stderr
    assert snapshot_dir(mine) == before
    assert sorted(p.name for p in mine.iterdir()) == ["data.bin", "notes"]

    # One update done and saved: that is work, and it stays.
    kept = tmp_path / "kept"
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   "--set", f"trainer.output_dir={kept}", "--set", "trainer.save_every=1",
                   env=worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_FAIL_AT="2"))
    assert proc.returncode == 1, proc.stderr
    assert (kept / "run.json").is_file() and (kept / "step_1.pt").is_file()


def test_a_factory_without_schema_and_an_objective_without_loss_result(tmp_path: Path
                                                                       ) -> None:
    """Catches `model: unknown key` for a factory that declares no config_schema (it reads
    as a typo in the recipe), and an AttributeError for an objective returning a tensor."""
    env = worker_env(PYTHONPATH=str(FACTORIES))
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", factory="rough_edges:no_schema")
    proc = run_cli("validate-config", str(recipe), env=env)
    assert proc.returncode == 2
    for section in ("model", "data"):
        assert (f"{section}: factory 'rough_edges:no_schema' has no config_schema"
                in proc.stderr), proc.stderr
    assert "unknown key" not in proc.stderr

    recipe = write_recipe(tmp_path / "t.yaml", tmp_path / "run", factory="rough_edges:bare_tensor",
                          **SMALL)
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env)
    assert proc.returncode == 1, proc.stderr
    assert "returned a bare tensor; it must return LossResult(loss=..., weight=...)" \
        in proc.stderr, proc.stderr
    assert "AttributeError" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # failed before its first update


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def two_updates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A first run of 2 updates into `ROOT/run` (the only run under ROOT), and what it printed
    to stderr: (ROOT, stderr). Shared, read-only."""
    root = tmp_path_factory.mktemp("two_updates")
    recipe, _ = small_run(root, **{"trainer.max_updates": 2, "trainer.save_every": 2})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert_ok(proc)
    return root, proc.stderr


@pytest.mark.parametrize("command", ["runs", "list-factories"])
def test_tables_are_readable_at_80_columns(two_updates: tuple[Path, str], command: str
                                           ) -> None:
    """Catches tables folded mid-word on an 80-column terminal (`finishe` / `d`)."""
    root, _ = two_updates
    run = root / "run"
    args = ["runs", str(root)] if command == "runs" else ["list-factories"]
    proc = run_cli(*args, env=worker_env(COLUMNS="80", FORCE_COLOR="1"))
    assert_ok(proc)
    lines = _ANSI.sub("", proc.stdout).splitlines()
    assert _ANSI.search(proc.stdout), "not rendered as for a terminal"
    whole = ([str(run), "finished", json.loads((run / "run.json").read_text())["run_id"][:12]]
             if command == "runs"
             else ["embodichain.plugins.sl_ddp:build_supervised_trainer", "init sl_ddp"])
    for word in whole:
        assert any(word in line for line in lines), (word, lines)
    assert all(len(line) <= 80 for line in lines), lines


@pytest.mark.parametrize("args", [["runs", "{tmp}", "--json"], ["list-factories"],
                                  ["inspect-checkpoint", "{tmp}/run/last.pt", "--json"]])
def test_a_closed_pipe_ends_a_command_quietly(two_updates: tuple[Path, str], args: list[str]
                                             ) -> None:
    """Catches `embodichain runs --json | head` ending with a BrokenPipeError traceback or
    "Exception ignored" (here the reader is gone before the command writes at all)."""
    root, _ = two_updates
    read, write = os.pipe()
    os.close(read)
    try:
        command = start_python_module("embodichain", *(a.format(tmp=root) for a in args),
                                      stdout=write, stderr=subprocess.PIPE, text=True)
        _, stderr = command.communicate(timeout=120)
        proc = subprocess.CompletedProcess(command.args, command.returncode, None, stderr)
    finally:
        os.close(write)
    assert proc.stderr == "", proc.stderr
    # 0, as when the whole output fitted in the pipe before the reader left: a variant
    # exiting 1 here makes `runs --json | head -1` exit 0 or 1 depending on timing.
    assert proc.returncode == 0


def test_a_first_run_prints_no_numpy_warning(two_updates: tuple[Path, str]) -> None:
    """Catches NumPy dropped from the dependencies: torch then warns `Failed to initialize
    NumPy` in every process that imports it, torchrun's launcher included."""
    requires = importlib.metadata.requires(embodichain.DISTRIBUTION) or []
    assert any(re.match(r"numpy\b", r) and "extra ==" not in r for r in requires), requires
    _, stderr = two_updates  # a first run's own output
    assert "Warning" not in stderr and "NumPy" not in stderr, stderr


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_report_writes_beside_the_run_and_never_overwrites_silently(
        tmp_path: Path, copy_run, sl_ddp_one_process: Path) -> None:
    """Catches `report` writing report.png into the current directory and replacing an
    existing file without being asked, and the run summary suggesting the plain `report`
    command that is then refused."""
    run = copy_run(sl_ddp_one_process)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert_ok(run_cli("report", str(run), cwd=cwd))
    png = (run / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and list(cwd.iterdir()) == []
    # the summary's `curves` line is a command that works: a second report needs --force
    curves = next(line for line in summary_lines(run) if line.lstrip().startswith("curves"))
    assert curves.rstrip().endswith(f"report {run} --force"), curves
    (run / "report.png").write_bytes(b"edited")
    again = run_cli("report", str(run), cwd=cwd)
    assert again.returncode == 2 and "--force" in again.stderr, again.stderr
    assert (run / "report.png").read_bytes() == b"edited"
    assert_ok(run_cli("report", str(run), "--force", cwd=cwd))
    assert (run / "report.png").read_bytes().startswith(b"\x89PNG")
    assert_ok(run_cli("report", str(run), "--format", "html", cwd=cwd))
    assert (run / "report.html").read_text().lstrip().startswith("<!")


def test_validate_config_does_not_care_about_write_permission(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches validate-config warning "no write permission" on a read-only checkout (it
    never writes). Tests run as root, for whom nothing is read-only: os.access is made to
    say so."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "ro" / "run")
    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if mode & os.W_OK
                        else real(path, mode, **kw))
    result = invoke("validate-config", str(recipe))
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr and "permission" not in result.stderr, result.stderr
