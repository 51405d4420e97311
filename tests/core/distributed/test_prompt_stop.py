"""R-PROC-3: a worker blocked in the rendezvous stops promptly on torchrun's SIGTERM."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO, run_torchrun, worker_env, write_recipe


def test_a_worker_waiting_in_the_rendezvous_ends_on_sigterm_not_sigkill(tmp_path: Path
                                                                        ) -> None:
    """Rank 1 fails before joining; torchrun then SIGTERMs rank 0, which waits in the
    rendezvous. The broken variant (the signal only recorded, for a Python handler that
    cannot run while C++ waits) is SIGKILLed 30 s later: its code in the report is
    `Signal 9`, not 143."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="late_rank_one:build_supervised_trainer")
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=worker_env(PYTHONPATH=str(REPO / "tests" / "factories")))
    assert proc.returncode == 1
    assert "stopped by SIGTERM while waiting for the other workers to join: nothing was " \
           "trained" in proc.stderr, proc.stderr
    rank0 = re.search(r"rank\s*: 0 \(local_rank: 0\)\n\s*exitcode\s*: (\S+)", proc.stderr)
    assert rank0 and rank0.group(1) == "143", proc.stderr
    assert not (tmp_path / "run").exists()
