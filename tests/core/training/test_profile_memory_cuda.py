"""The profile and the memory figures on CUDA (R-OPS-2, R-OPS-3): skipped without a CUDA
device; run by benchmarks/gpu_check.sh on a GPU machine."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from embodichain.core.runs.run_dir import read_metrics
from tests.support import assert_ok, factories_env, run_cli, worker_env, write_recipe

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
RUN = {"device": "cuda", "trainer.max_updates": 6, "trainer.log_every": 2,
       "trainer.validate_every": 0, "trainer.save_every": 0, "trainer.memory_snapshot": True}


def test_cuda_profile_records_kernels_and_the_allocator_snapshot(tmp_path: Path) -> None:
    """Catches a CUDA run profiled on the CPU only, a table not by CUDA self time, no
    snapshot at the window's end, and device figures missing from the lines."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **RUN,
                          **{"trainer.profile": {"start": 2, "updates": 2}})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=worker_env()))
    run = tmp_path / "run"
    events = json.loads((run / "profile" / "rank_0.2.pt.trace.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events if isinstance(e, dict))
    assert "by self_cuda_time_total" in (run / "profile" / "top_operators.2.txt").read_text()
    with open(run / "memory" / "rank_0.profile_2.pickle", "rb") as f:
        assert "segments" in pickle.load(f)
    lines = [r for r in read_metrics(run / "metrics.jsonl").records if "train/loss" in r]
    assert all(r["memory/peak_rank_0"] > 0 and r["time/split/forward_backward"] > 0
               for r in lines)


def test_cuda_out_of_memory_names_the_figures_and_writes_the_snapshot(tmp_path: Path) -> None:
    """Catches a real allocator failure ending in torch's traceback rather than the
    message, the device's total missing, and no snapshot at the error."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **RUN,
                          factory="exhausting:build_supervised_trainer")
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                   env=factories_env(EMBODICHAIN_TEST_OOM_AT="3"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "out of memory on cuda" in output and "in update 3" in output
    assert "allocated of the device's" in output
    snapshot = tmp_path / "run" / "memory" / "rank_0.oom_update_3.pickle"
    assert snapshot.is_file() and str(snapshot) in output
