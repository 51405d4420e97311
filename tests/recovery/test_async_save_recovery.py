"""Background saves under faults (R-CKPT-8, R-CKPT-9, R-CKPT-6, R-SIG-1), real torchrun workers.

Every fault is placed deterministically: kill_points.py SIGKILLs rank 0 at a chosen call of
the background writer's thread, hold_writes.py holds a background write until a signal has
arrived or lets rank 0 wait for a failed write before a given update. Nothing depends on how
fast this machine is.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.names import step_files
from tests.support import (
    SHORT_RECIPE,
    TESTS,
    assert_ok,
    run_python_module,
    run_torchrun,
    start_python_module,
    write_recipe,
)
from tests.support.recovery import (
    assert_only_torchruns_traceback,
    assert_training_state_equal,
    factory_env,
    metrics,
)
from tests.support.state_compare import comparable_records

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

GUARD = 240
PACED = "restarting:build_supervised_trainer"  # EMBODICHAIN_TEST_SLEEP_S per update


def env(hold: dict | None = None, log: Path | None = None, **extra: str) -> dict[str, str]:
    e = factory_env(**extra)
    e["PYTHONPATH"] = os.pathsep.join([str(TESTS / "factories"), e["PYTHONPATH"]])
    if hold is not None:
        e.update(EMBODICHAIN_TEST_HOLD=json.dumps(hold), EMBODICHAIN_TEST_HOLD_LOG=str(log))
    return e


def events(log: Path, rank: int = 0) -> list[dict]:
    path = Path(f"{log}.rank{rank}")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def verified_steps(directory: Path) -> dict[str, int]:
    """Every *.pt verifies (digest recomputed); name -> step."""
    return {p.name: read_checkpoint(p)["manifest"]["step"] for p in directory.glob("*.pt")}


def temps(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


# -- SIGKILL of rank 0 inside a background write ----------------------------------------------

K = 5
SHORT = SHORT_RECIPE


def test_sigkill_of_rank_zero_inside_a_background_write(short_two_workers: Path,
                                                        tmp_path: Path) -> None:
    """Catches a background write that publishes a name before its file is complete, that
    lets last.pt run ahead of a durable step file, or a resume that trusts a torn save."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **SHORT)
    mark = tmp_path / "mark.json"
    point = {"at": "replace", "name": "last.pt", "nth": K}  # save of update K, in flight
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        module="kill_points", timeout=GUARD,
                        env=factory_env(EMBODICHAIN_TEST_KILL_POINT=json.dumps(point),
                                        EMBODICHAIN_TEST_KILL_MARK=str(mark)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and mark.is_file(), out
    landed = json.loads(mark.read_text())
    # inside the background write: its thread, the temp file complete, last.pt not replaced
    assert landed["thread"] == "embodichain-save-step_5.pt", landed
    assert landed["src_exists"] and landed["dst_exists"], landed
    steps = verified_steps(run)
    assert steps.pop("last.pt") == K - 1
    assert sorted(steps.values()) == list(range(1, K)), steps
    assert [t.split(".pt.")[0] for t in temps(run)] == [".last", f".step_{K}"]
    logged = max(r["step"] for r in metrics(run))  # how far training had gone
    lost = logged - (K - 1)
    assert 1 <= lost <= 2, logged  # one save in flight: the next boundary waits for it

    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume", "auto",
                           "--no-progress", timeout=GUARD))
    assert assert_training_state_equal(short_two_workers / "last.pt", run / "last.pt") >= 18
    assert comparable_records(run) == comparable_records(short_two_workers)
    assert not temps(run)
    print(f"SIGKILL inside the background write of update {K}: {lost} update(s) lost")


# -- a background write that fails --------------------------------------------------------------


@pytest.mark.parametrize("when", ["at the next update", "at the end"])
def test_a_failed_background_write_stops_every_rank(tmp_path: Path, when: str) -> None:
    """`recovery_factories:failing_save` limits rank 0's file size at update 50, so the
    background write of step_100.pt fails with EFBIG (a full disk). Catches a failure that
    stays in the writer's thread (the run would go on to 200 and exit 0), one that only rank 0
    hears of (rank 1 would hang or exit otherwise), and an end that does not wait."""
    run, log = tmp_path / "run", tmp_path / "hold.log"
    at_end = when == "at the end"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="recovery_factories:failing_save",
                          **{"trainer.max_updates": 100 if at_end else 200,
                             "trainer.log_every": 2})  # metrics.jsonl below the file limit
    start = time.monotonic()
    hold = {} if at_end else {"drain_before": 150}  # by 150 the failure is known on rank 0
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        module="hold_writes", env=env(hold, log), timeout=GUARD)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert time.monotonic() - start < GUARD
    reason = f"saving checkpoint {run / 'step_100.pt'} failed on rank 0: File too large"
    assert len(re.findall(rf"^error: {re.escape(reason)}", out, re.M)) == 1, out  # rank 0
    assert out.count(f"[rank 1] error: {reason}") == 1, out  # and rank 1
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M) == ["1", "1"], out
    assert_only_torchruns_traceback(out)
    last = max(r["step"] for r in metrics(run))
    if at_end:
        assert last == 100
    else:  # told through the update's all-reduce as soon as rank 0 knows, at 151 the latest
        drained = [e["event"] for e in events(log)]
        assert drained in ([], ["drained"]), drained  # [] when the stop came before 150
        assert 100 <= last <= 150, last  # 100: the stop came with update 101 itself
    assert sorted(p.name for p in run.iterdir()) == [".lock", "metrics.jsonl", "run.json"]


# -- Ctrl-C while a save is in flight -----------------------------------------------------------

PACED_RECIPE = {"factory": PACED, "trainer.max_updates": 60, "trainer.save_every": 20,
                "trainer.log_every": 1, "trainer.validate_every": 0}


def test_ctrl_c_while_a_background_save_is_in_flight(tmp_path: Path) -> None:
    """The write of step_20.pt is held until SIGINT has arrived. Catches a stop snapshot
    written beside (or before) the save in flight, and an exit that abandons it."""
    reference = tmp_path / "reference"
    ref_recipe = write_recipe(tmp_path / "ref.yaml", reference, **PACED_RECIPE)
    assert_ok(run_torchrun("train-sl", "--config", str(ref_recipe), "--no-progress",
                           env=env(), timeout=GUARD))

    run, log = tmp_path / "run", tmp_path / "hold.log"
    recipe = write_recipe(tmp_path / "r.yaml", run, **PACED_RECIPE)
    cmd = ["--standalone", "--nnodes=1", "--nproc-per-node=2", "-m", "hold_writes", "train-sl",
           "--config", str(recipe), "--no-progress"]
    proc = start_python_module("torch.distributed.run", *cmd, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env=env({"until_signal": 20}, log, EMBODICHAIN_TEST_SLEEP_S="0.05"))
    try:
        deadline = time.monotonic() + GUARD
        while not any(e["event"] == "in_flight" for e in events(log)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # torchrun forwards it to both workers
    finally:
        out, err = proc.communicate(timeout=GUARD)
    assert proc.returncode != 0, out + err
    stopped = read_checkpoint(run / "last.pt")["manifest"]["step"]
    assert 20 <= stopped < 60, err
    assert f"stopped by SIGINT at update {stopped} of 60" in err, err
    # (on a loaded machine training may reach the save at 40 before the signal arrives: that
    # save then waits for step_20.pt too, and the stop comes after it)
    later = [40] if stopped >= 40 else []
    assert verified_steps(run) == {"step_20.pt": 20, "last.pt": stopped,
                                   **{f"step_{n}.pt": n for n in later}}
    # one after the other: step_20.pt published, then the stop snapshot written
    order = [(e["event"], e.get("file"), e.get("step")) for e in events(log)]
    expected = [("in_flight", "step_20.pt", 20), ("released", "step_20.pt", 20),
                ("published", "step_20.pt", 20)]
    expected += [("published", f"step_{n}.pt", n) for n in later]
    expected += [] if stopped in (20, *later) else [("published", "last.pt", stopped)]
    assert order == expected, order
    assert not temps(run)

    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=env(), timeout=GUARD))
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 18
    assert comparable_records(run) == comparable_records(reference)
    print(f"SIGINT with step_20.pt in flight: stopped at {stopped}, both complete")


# -- trainer.save_every_s -----------------------------------------------------------------------

EVERY_S, SLEEP_S, KILL_AT = 1.0, 0.05, 60
UPDATES_PER_S = 1 / SLEEP_S  # at most: every update sleeps SLEEP_S


@pytest.mark.parametrize("nproc", [1, 2])
def test_save_every_s_snapshots_by_time_and_bounds_the_loss(tmp_path: Path, nproc: int
                                                            ) -> None:
    """A slow recipe (SLEEP_S per update) with `save_every_s` and no step files, SIGKILLed
    (rank 0) before update KILL_AT. Catches time-based saves that never happen (all KILL_AT-1
    updates lost), that happen at different updates on different ranks (a rank would save
    alone: the collective would hang), and a clock that is not restarted by a save."""
    run, log = tmp_path / "run", tmp_path / "hold.log"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory=PACED,
                          **{"trainer.max_updates": 1000, "trainer.save_every": 0,
                             "trainer.save_every_s": EVERY_S, "trainer.log_every": 1,
                             "trainer.validate_every": 0})
    hold_env = env({"log_saves": True, "kill_at": KILL_AT}, log,
                   EMBODICHAIN_TEST_SLEEP_S=str(SLEEP_S))
    args = ("train-sl", "--config", str(recipe), "--no-progress")
    if nproc == 2:
        proc = run_torchrun(*args, module="hold_writes", env=hold_env, timeout=GUARD)
        assert proc.returncode == 1, proc.stdout + proc.stderr
    else:
        proc = run_python_module("hold_writes", *args, env=hold_env, timeout=GUARD)
        assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    saves = [e for e in events(log) if e["event"] == "save"]
    killed = events(log)[-1]
    assert (killed["event"], killed["before_update"]) == ("killed", KILL_AT), killed
    assert len(saves) >= 2 and all(s["file"] == "last.pt" for s in saves), saves
    steps = [s["step"] for s in saves]
    if nproc == 2:  # every rank saved at the same updates (rank 0's clock decided)
        assert [s["step"] for s in events(log, 1) if s["event"] == "save"] == steps
    for before, after in zip(saves, saves[1:], strict=False):
        assert after["t"] - before["t"] >= EVERY_S  # by rank 0's clock, S apart at least
        assert 1 <= after["step"] - before["step"] <= EVERY_S * UPDATES_PER_S + 2
    durable = verified_steps(run)
    assert list(durable) == ["last.pt"] and durable["last.pt"] in steps
    lost = (KILL_AT - 1) - durable["last.pt"]
    # at most S (plus a save in flight, whose predecessor is complete) of updates
    assert 0 <= lost <= 2 * EVERY_S * UPDATES_PER_S + 2, (lost, steps)
    assert not step_files(run)
    print(f"save_every_s={EVERY_S} at <= {UPDATES_PER_S:.0f} updates/s, {nproc} process(es): "
          f"time saves at {steps}; SIGKILL before update {KILL_AT} lost {lost} updates")

