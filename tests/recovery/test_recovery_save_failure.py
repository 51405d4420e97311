"""R-CKPT-6: a save that fails on rank 0 makes every rank exit non-zero promptly, with the reason.

`recovery_factories:failing_save` limits rank 0's file size at the first validation (update 50),
as a full disk would, so writing step_100.pt fails with EFBIG on rank 0 only. Rank 1 is then
waiting in the save's collective: it must hear of the failure and stop too, not hang.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from embodichain.core.runs.run_dir import read_metrics
from tests.support import run_torchrun, start_python_module, write_recipe
from tests.support.recovery import assert_only_torchruns_traceback, factory_env, metrics

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

GUARD = 240  # a hang fails the test by timeout instead of blocking CI
# "Promptly": from the failed save to the exit of every rank. torchrun's own teardown takes
# a few seconds, even on a loaded machine; a rank left waiting for a collective's timeout
# (gloo's default: 30 minutes), or a grace period before giving up, takes far longer.
PROMPTLY = 60


def test_failed_save_on_rank_zero_stops_every_rank(tmp_path: Path) -> None:
    """Catches a rank that never hears of the failure (torchrun's report then shows it
    killed, not exiting 1 with the reason) and one that stops only after waiting for a
    timeout (every rank exits 1 with the reason, but not within PROMPTLY of the save)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="recovery_factories:failing_save",
                          **{"trainer.max_updates": 200,
                             "trainer.async_save": False})  # background: test_async_save_*
    cmd = ["--standalone", "--nnodes=1", "--nproc-per-node=2", "-m", "embodichain",
           "train-sl", "--config", str(recipe), "--no-progress"]
    with start_python_module("torch.distributed.run", *cmd, env=factory_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) as running:
        deadline = time.monotonic() + GUARD
        # update 100's record is written just before its save (the one that fails)
        while not ((run / "metrics.jsonl").exists()
                   and (read_metrics(run / "metrics.jsonl").last_step or 0) >= 100):
            assert running.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        failed_at = time.monotonic()
        out, _ = running.communicate(timeout=GUARD)
        elapsed = time.monotonic() - failed_at
    proc = subprocess.CompletedProcess(cmd, running.returncode, out, "")
    assert proc.returncode == 1, out
    reason = f"saving checkpoint {run / 'step_100.pt'} failed on rank 0: File too large"
    assert len(re.findall(rf"^error: {re.escape(reason)}", out, re.M)) == 1, out  # rank 0
    assert out.count(f"[rank 1] error: {reason}") == 1, out  # and rank 1, each with the reason
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M) == ["1", "1"], out
    assert_only_torchruns_traceback(out)
    assert elapsed < PROMPTLY, f"every rank exited {elapsed:.0f} s after the failed save"
    print(f"every rank exited {elapsed:.1f} s after the failed save")
    # it stopped at the failed save: nothing after update 100, no checkpoint, no temp file left
    assert max(r["step"] for r in metrics(run)) == 100
    # (.lock is the run lock's file, R-RUN-5: the kernel released the lock with the process)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "metrics.jsonl", "run.json"]


def test_unexpected_failure_while_preparing_on_rank_zero_stops_every_rank(tmp_path: Path
                                                                          ) -> None:
    """Rank 0 alone prepares the run directory; an unexpected error there (an OS error is a
    refusal: output_dir cannot be used) must reach the other ranks, which wait for that
    outcome, instead of hanging them."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="recovery_factories:failing_prepare")
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=factory_env(), timeout=GUARD)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    reason = "preparing the run failed on rank 0: RuntimeError: simulated failure while preparing"
    assert len(re.findall(rf"^error: {re.escape(reason)}", out, re.M)) == 1, out  # rank 0
    assert out.count(f"[rank 1] error: {reason}") == 1, out
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M) == ["1", "1"], out
    assert_only_torchruns_traceback(out)
