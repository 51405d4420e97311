"""R-CKPT-6: a save that fails on rank 0 makes every rank exit non-zero promptly, with the reason.

`recovery_factories:failing_save` limits rank 0's file size at the first validation (update 50),
as a full disk would, so writing step_100.pt fails with EFBIG on rank 0 only. Rank 1 is then
waiting in the save's collective: it must hear of the failure and stop too, not hang.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from conftest import run_torchrun, write_recipe
from recovery_helpers import factory_env, metrics

GUARD = 240  # a hang fails the test by timeout instead of blocking CI


def assert_only_torchruns_traceback(out: str) -> None:
    """Workers print one-line errors (SPEC §9); the only traceback is torchrun's own report."""
    tracebacks = out.split("Traceback (most recent call last):")[1:]
    assert len(tracebacks) == 1 and "ChildFailedError" in tracebacks[0], out
    assert out.count("Traceback") == 1, out


def test_failed_save_on_rank_zero_stops_every_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="recovery_factories:failing_save",
                          **{"trainer.max_updates": 200,
                             "trainer.async_save": False})  # background: test_async_save_*
    start = time.monotonic()
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=factory_env(), timeout=GUARD)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    reason = f"saving checkpoint {run / 'step_100.pt'} failed on rank 0: File too large"
    assert len(re.findall(rf"^error: {re.escape(reason)}", out, re.M)) == 1, out  # rank 0
    assert out.count(f"[rank 1] error: {reason}") == 1, out  # and rank 1, each with the reason
    assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M) == ["1", "1"], out
    assert_only_torchruns_traceback(out)
    assert elapsed < GUARD
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
