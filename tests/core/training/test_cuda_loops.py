"""The training loops on CUDA (R-LOOP-1..4): skipped without a CUDA device; run by
benchmarks/gpu_check.sh on the first GPU machine. No GPU has run them yet."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support import assert_ok, run_cli, run_torchrun, worker_env, write_recipe
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ENV = worker_env()
# Bitwise resume on CUDA is promised only with trainer.deterministic (R-DET-1): the product
# sets CUBLAS_WORKSPACE_CONFIG and the rest itself, so the test environment does not.
DETERMINISTIC = {"trainer.deterministic": True}


def recipe(tmp_path: Path, name: str, **changes) -> Path:
    return write_recipe(tmp_path / f"{name}.yaml", tmp_path / name, device="cuda", **{
        "trainer.max_updates": 30, "trainer.save_every": 15, "trainer.validate_every": 15,
        "trainer.log_every": 5, **changes})


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cuda_mixed_precision_trains_with_its_scaler(tmp_path: Path, precision: str) -> None:
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    path = recipe(tmp_path, "run", **{"trainer.precision": precision})
    assert_ok(run_cli("train-sl", "--config", str(path), "--no-progress", env=ENV))
    learner = read_checkpoint(tmp_path / "run" / "last.pt")["payload"]["learner"]
    assert bool(learner["grad_scaler"]) == (precision == "fp16")  # scaler state saved
    mse = [r["validation/mse"] for r in comparable_records(tmp_path / "run")
           if "validation/mse" in r]
    assert mse[-1] < mse[0]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_accumulation_and_ema_resume_exactly(tmp_path: Path, precision: str) -> None:
    changes = {"trainer.batch_size": 8, "trainer.grad_accumulation": 4,
               "trainer.ema": {"decay": 0.9, "validate": "both"},
               "trainer.precision": precision, **DETERMINISTIC}
    full = recipe(tmp_path, "full", **changes)
    assert_ok(run_cli("train-sl", "--config", str(full), "--no-progress", env=ENV))
    resumed = recipe(tmp_path, "resumed", **changes)
    assert_ok(run_cli("train-sl", "--config", str(resumed), "--no-progress", "--resume",
                      str(tmp_path / "full" / "step_15.pt"), env=ENV))
    assert assert_training_state_equal(tmp_path / "full" / "last.pt",
                                       tmp_path / "resumed" / "last.pt") > 0


def test_cuda_torchrun_accumulation_matches_the_large_batch(tmp_path: Path) -> None:
    """torchrun with every visible GPU (up to 2; NCCL when 2): K=4 x 8 == K=1 x 32."""
    nproc = min(2, torch.cuda.device_count())
    a = recipe(tmp_path, "k4", **{"trainer.batch_size": 8, "trainer.grad_accumulation": 4})
    b = recipe(tmp_path, "k1", **{"trainer.batch_size": 32})
    for path in (a, b):
        assert_ok(run_torchrun("train-sl", "--config", str(path), "--no-progress",
                               nproc=nproc, env=ENV))
    ma = read_checkpoint(tmp_path / "k4" / "last.pt")["payload"]["learner"]["model"]
    mb = read_checkpoint(tmp_path / "k1" / "last.pt")["payload"]["learner"]["model"]
    for name in mb:
        assert (ma[name] - mb[name]).abs().max() <= 1e-4 * mb[name].abs().max(), name
