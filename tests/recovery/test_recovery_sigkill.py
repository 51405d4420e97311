"""R-CKPT-2: a SIGKILL at any instant leaves every checkpoint, run.json and metrics.jsonl readable.

One-process runs saving every update are killed at random moments by
tests/recovery/sigkill_driver.py (one process suffices: rank 0 alone writes): fresh runs, and
chains in which a killed run is resumed in place and killed again. After each kill every
`*.pt` verifies, `last.pt` exists once any step file does and is never older than the newest
one, run.json parses and read_metrics never raises; and every surviving checkpoint holds
exactly the state of the uninterrupted run at its step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.names import step_files
from embodichain.core.runs.run_dir import read_metrics
from tests.support import (
    REPO,
    SHORT_RECIPE,
    assert_ok,
    run_cli,
    run_torchrun,
    worker_env,
    write_recipe,
)
from tests.support.processes import run_python_module
from tests.support.recovery import RECOVERY, factory_env
from tests.support.state_compare import assert_payloads_equal, assert_same_outcome, implied_events

# 12 fresh runs and 8 chain links: 20 kills, about 200 surviving checkpoints compared (each
# fresh run leaves some 18 on average); the kills inside each save and roll-back window are
# placed exactly by the tests further down, this sample adds the moments between them.
FRESH_KILLS, CHAIN_KILLS, SEED = 12, 8, 20240601


def _read(path: Path, cache: dict[int, dict]) -> dict:
    """read_checkpoint, once per inode: chain snapshots hard-link unchanged checkpoints."""
    inode = path.stat().st_ino
    if inode not in cache:
        cache[inode] = read_checkpoint(path)
    return cache[inode]


def _verify(directory: Path, reference: dict[int, dict], fresh: bool, cache: dict[int, dict]
            ) -> dict[str, int]:
    checkpoints = {p.name: _read(p, cache) for p in directory.glob("*.pt")}  # all verify
    assert not [p for p in directory.glob("*.pt") if not p.is_file()]
    steps = [n for n, _ in step_files(directory)]
    last_step = None
    if steps:
        assert "last.pt" in checkpoints, f"{directory}: step files without last.pt"
    if "last.pt" in checkpoints:
        last_step = checkpoints["last.pt"]["manifest"]["step"]
        assert last_step >= max(steps, default=0), f"{directory}: last.pt older than a step file"
    if fresh:  # an uninterrupted sequence step_1 .. step_N, and last.pt at N or N + 1
        assert steps == list(range(1, len(steps) + 1)), f"{directory}: {steps}"
        if steps:
            assert last_step in (steps[-1], steps[-1] + 1)
    for name, data in checkpoints.items():
        step = data["manifest"]["step"]
        assert name in ("last.pt", f"step_{step}.pt")
        if step in reference:  # the whole state: learner, every rank, run.metrics, callbacks
            expected = reference[step]
            if not fresh:  # the chains' recipe logs nothing, so no metrics ride along
                expected = {**expected, "run": {**expected["run"], "metrics": {}}}
            assert assert_payloads_equal(data["payload"], expected) > 0, name

    run = json.loads((directory / "run.json").read_text()) if (directory / "run.json").exists() \
        else None
    if checkpoints:
        assert run is not None and run["run_id"] == checkpoints["last.pt"]["manifest"]["run_id"]
    log = read_metrics(directory / "metrics.jsonl")  # never raises
    assert not log.bad_lines
    logged = [r["step"] for r in log.records]
    if fresh:  # log_every=1: record N is written just before checkpoint N
        assert logged == list(range(1, len(logged) + 1))
        if last_step is not None:  # + 2: update N + 2 ran while save N + 1 was in flight
            assert len(logged) in (last_step, last_step + 1, last_step + 2)
    return {"checkpoints": len(checkpoints), "compared": sum(
        1 for d in checkpoints.values() if d["manifest"]["step"] in reference)}


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_everything_readable(tmp_path: Path) -> None:
    """Catches a checkpoint, run.json or metrics.jsonl left unreadable by a kill, and a
    surviving checkpoint whose state (learner, every rank, run.metrics, callbacks) is not
    the uninterrupted run's at its step."""
    recipe = write_recipe(tmp_path / "every_update.yaml", tmp_path / "unused",
                          **{"trainer.max_updates": 1_000_000, "trainer.save_every": 1,
                             "trainer.log_every": 1, "trainer.validate_every": 0})
    root = tmp_path / "kills"
    proc = run_python_module("sigkill_driver", str(recipe), str(root), str(FRESH_KILLS),
                             str(CHAIN_KILLS), str(SEED), timeout=300,
                             env=worker_env(PYTHONPATH=f"{RECOVERY}{os.pathsep}{REPO}"))
    assert proc.returncode == 0, proc.stderr + "".join(
        f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((root / "logs").glob("*")))
    report = json.loads(proc.stdout)

    ref_dir = Path(report["reference"]["dir"])
    reference = {n: read_checkpoint(p)["payload"] for n, p in step_files(ref_dir)}
    assert sorted(reference) == list(range(1, report["reference"]["updates"] + 1))

    kills = report["kills"]
    assert all(k.get("signal") == 9 for k in kills), kills  # no child ended on its own
    assert len(kills) >= 20
    totals = {"checkpoints": 0, "compared": 0}
    cache: dict[int, dict] = {}
    for kill in kills:
        counts = _verify(Path(kill["dir"]), reference, kill["kind"] == "fresh", cache)
        totals = {k: totals[k] + counts[k] for k in totals}
    # the kills did land during training and saving ...
    assert sum(1 for k in kills if any(Path(k["dir"]).glob("step_*.pt"))) >= len(kills) // 2
    assert totals["compared"] >= 100, totals
    print(f"{len(kills)} kills: {totals}")
    # ... and killed runs were resumed in place, continued (exactly: compared above), and
    # recorded each resume in run.json
    progressed = 0
    for before, after in zip(kills, kills[1:], strict=False):
        if after.get("resumed") and after["chain"] == before.get("chain"):
            old, new = (_last_step(Path(k["dir"])) for k in (before, after))
            if new is not None and old is not None and new > old:
                progressed += 1
                events = json.loads((Path(after["dir"]) / "run.json").read_text())["events"]
                assert events and all(e["event"] == "resumed" for e in events)
    assert progressed >= 1, report


def _last_step(directory: Path) -> int | None:
    last = directory / "last.pt"
    return read_checkpoint(last)["manifest"]["step"] if last.exists() else None


# -- deterministic kills inside each critical window ---------------------------------------------
#
# tests/recovery/kill_points.py runs the real CLI and SIGKILLs it at a chosen call (it wraps
# os.replace, Path.unlink or the trainer's state capture in that process only), recording what
# it was about to do. Each test asserts that the kill landed inside its window (the mark, and
# the directory state only that window leaves), that the directory stays readable, and that
# `embodichain resume` then finishes the run exactly as the uninterrupted one.

K = 5  # the update whose save is interrupted
SHORT = SHORT_RECIPE
GUARD = 240


@pytest.fixture(scope="module")
def short_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The short recipe trained to the end in one process, without interruption."""
    root = tmp_path_factory.mktemp("short_reference")
    recipe = write_recipe(root / "r.yaml", root / "run", **SHORT)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", timeout=GUARD))
    return root / "run"


def _killed(args: list[str], point: dict, mark: Path, nproc: int = 1
            ) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run `embodichain ARGS` through kill_points; returns the process and its kill mark."""
    env = factory_env(EMBODICHAIN_TEST_KILL_POINT=json.dumps(point),
                      EMBODICHAIN_TEST_KILL_MARK=str(mark))
    if nproc > 1:
        proc = run_torchrun(*args, nproc=nproc, module="kill_points", env=env, timeout=GUARD)
    else:
        proc = run_python_module("kill_points", *args, env=env, timeout=GUARD)
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert mark.is_file(), f"the kill point {point} was never reached:\n{out}"
    return proc, json.loads(mark.read_text())


def _readable(directory: Path) -> dict[str, int]:
    """Every *.pt verifies, run.json parses, metrics.jsonl reads; returns name -> step."""
    steps = {p.name: read_checkpoint(p)["manifest"]["step"] for p in directory.glob("*.pt")}
    run = json.loads((directory / "run.json").read_text())
    assert steps and run["run_id"] == read_checkpoint(directory / "last.pt")["manifest"]["run_id"]
    log = read_metrics(directory / "metrics.jsonl")
    assert not log.bad_lines
    return steps


def _temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def _resume_to_the_end(directory: Path, reference: Path, snapshot_step: int, nproc: int = 1,
                       events: list[tuple] | None = None) -> None:
    """`embodichain resume` finishes the run exactly as the uninterrupted one: every
    checkpoint, metrics.jsonl and run.json's events (`events`; by default what the
    directory implies now: a roll-back of the records the kill left past the snapshot, then
    the resume) as `assert_same_outcome` checks them, every side file named by an event."""
    events = implied_events(directory, snapshot_step) if events is None else events
    launch = run_torchrun if nproc > 1 else run_cli
    assert_ok(launch("resume", str(directory), "--no-progress", timeout=GUARD))
    assert_same_outcome(directory, reference, events=events)
    assert not _temps(directory), _temps(directory)  # the stale temp files were removed


WINDOWS = {
    # save of update K: temp file complete, last.pt not yet replaced
    "before the last.pt rename": {"at": "replace", "name": "last.pt", "nth": K},
    # last.pt already holds update K; step_K.pt not yet renamed into place
    "between the last.pt and step file renames": {"at": "replace", "name": f"step_{K}.pt"},
    # keep_last=2: step_K saved, step_{K-2} about to be deleted
    "during keep_last deletion": {"at": "unlink", "name": f"step_{K - 2}.pt"},
}


@pytest.mark.slow
@pytest.mark.parametrize("window", list(WINDOWS))
def test_sigkill_inside_a_save_window_leaves_a_resumable_run(
        short_reference: Path, tmp_path: Path, window: str) -> None:
    """Catches a resume that does not roll back the records past the snapshot (e.g.
    `roll_back.roll_back` returning at once: metrics.jsonl then reads 1..5, 5, 6, ..)
    or does not record it (no `rolled_back` event with the count), and any inexact state."""
    run = tmp_path / "run"
    keep = {"trainer.keep_last": 2} if "keep_last" in window else {}
    recipe = write_recipe(tmp_path / "r.yaml", run, **SHORT, **keep)
    _, mark = _killed(["train-sl", "--config", str(recipe), "--no-progress"], WINDOWS[window],
                      tmp_path / "mark.json")
    steps = _readable(run)
    step_files_left = sorted(int(n[5:-3]) for n in steps if n.startswith("step_"))
    if window == "before the last.pt rename":
        assert mark["src_exists"] and mark["dst_exists"], mark
        assert steps["last.pt"] == K - 1 and step_files_left == list(range(1, K))
        assert [t.split(".pt.")[0] for t in _temps(run)] == [".last", f".step_{K}"]
    elif window == "between the last.pt and step file renames":
        assert mark["src_exists"] and not mark["dst_exists"], mark
        assert steps["last.pt"] == K and step_files_left == list(range(1, K))
        assert [t.split(".pt.")[0] for t in _temps(run)] == [f".step_{K}"]
    else:
        assert mark["exists"], mark
        assert steps["last.pt"] == K and step_files_left == [K - 2, K - 1, K]
    _resume_to_the_end(run, short_reference, steps["last.pt"])
    if keep:
        assert sorted(p.name for p in run.glob("step_*.pt")) == ["step_11.pt", "step_12.pt"]


def _side_files(directory: Path) -> tuple[list[str], list[str]]:
    """The roll-back side files on disk, and those run.json's events name."""
    events = json.loads((directory / "run.json").read_text()).get("events") or []
    named = [e["moved_to"] for e in events if e["event"] == "rolled_back"]
    return sorted(p.name for p in directory.glob("metrics.rolled_back.*.jsonl")), named


SIDE = "metrics.rolled_back.1.jsonl"
ROLL_BACK_WINDOWS = {
    # the resume's first run.json update (its roll-back event) in flight: nothing moved yet
    "before the roll-back is recorded": {"at": "replace", "name": "run.json"},
    # the event names the side file; the side file complete, not yet in place
    "before the side file is in place": {"at": "replace", "name": SIDE},
    # the side file in place; metrics.jsonl still holds the records it copies
    "before metrics.jsonl is replaced": {"at": "replace", "name": "metrics.jsonl"},
    # the records moved; the resume's own event not yet recorded
    "before the resume is recorded": {"at": "replace", "name": "run.json", "nth": 2},
}


@pytest.fixture(scope="module")
def killed_after_k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SHORT in one process, SIGKILLed inside the save of update K + 1 (before its last.pt
    rename): snapshot K, records past it. Each roll-back test resumes a copy (read-only)."""
    root = tmp_path_factory.mktemp("killed_after_k")
    recipe = write_recipe(root / "r.yaml", root / "run", **SHORT)
    _killed(["train-sl", "--config", str(recipe), "--no-progress"],
            {"at": "replace", "name": "last.pt", "nth": K + 1}, root / "mark1.json")
    return root / "run"


@pytest.mark.slow
@pytest.mark.parametrize("window", list(ROLL_BACK_WINDOWS))
def test_sigkill_inside_a_roll_back_leaves_every_side_file_named_and_is_finished_once(
        short_reference: Path, killed_after_k: Path, tmp_path: Path, window: str) -> None:
    """R-RESUME-6: a resume in place killed anywhere inside its roll-back leaves run.json
    whole and no side file that no event names, and the next resume finishes that roll-back
    once. Catches the records moved before the `rolled_back` event is recorded (a side file
    no event names: "before the roll-back is recorded"), a run.json update that is not
    atomic, and a next resume that is not idempotent: one that rolls back again (a second
    event and side file), appends to the side file (twice the records) or loses records."""
    run = tmp_path / "run"
    shutil.copytree(killed_after_k, run)
    before = (run / "run.json").read_bytes()
    records = (run / "metrics.jsonl").read_bytes()
    expected = implied_events(run, K)  # one roll-back of the records past update K, one resume
    assert expected[-2:] == [("rolled_back", K, expected[-2][2]), ("resumed", K)], expected
    _, mark = _killed(["resume", str(run), "--no-progress"], ROLL_BACK_WINDOWS[window],
                      tmp_path / "mark2.json")
    assert mark["src_exists"] and Path(mark["src"]).exists(), mark  # complete, not in place
    _readable(run)
    on_disk, named = _side_files(run)
    assert set(on_disk) <= set(named), (on_disk, named)  # every side file is named
    logged = max(r["step"] for r in read_metrics(run / "metrics.jsonl").records)
    if window == "before the roll-back is recorded":
        assert Path(mark["src"]).name.startswith(".run.json."), mark
        assert (run / "run.json").read_bytes() == before  # the old run.json, whole
        assert on_disk == [] and (run / "metrics.jsonl").read_bytes() == records
    elif window == "before the resume is recorded":
        assert on_disk == named == [SIDE] and logged == K  # moved, and recorded before
    else:
        assert named == [SIDE] and logged > K  # recorded; metrics.jsonl still whole
        assert on_disk == ([SIDE] if window == "before metrics.jsonl is replaced" else [])
    _resume_to_the_end(run, short_reference, K, events=expected)


@pytest.mark.slow
def test_sigkill_of_one_torchrun_worker_leaves_a_resumable_run(short_two_workers: Path,
                                                              tmp_path: Path) -> None:
    """Rank 1 dies while the ranks gather the state of update K for its save."""
    reference = short_two_workers  # SHORT by 2 workers, uninterrupted (conftest)
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **SHORT)
    proc, mark = _killed(["train-sl", "--config", str(recipe), "--no-progress"],
                         {"at": "capture", "step": K, "rank": 1}, tmp_path / "mark.json",
                         nproc=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and mark == {"at": "capture", "step": K, "rank": 1,
                                         "thread": "MainThread"}, out
    assert re.search(r"^\s*exitcode\s*:\s*-9\b", out, re.M), out  # rank 1, SIGKILLed
    steps = _readable(run)
    assert steps["last.pt"] == K - 1 and f"step_{K}.pt" not in steps, (steps, out)
    _resume_to_the_end(run, reference, K - 1, nproc=2)
