"""R-LOOP-4: `trainer.precision` and `trainer.compile` train and resume exactly; a precision
the device cannot run is refused before training; NeRD's own `precision:` key still works
(a deprecated alias of `trainer.precision`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support import REPO, assert_ok, run_cli, write_recipe
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_training_state_equal, comparable_records

HAS_COMPILER = any(shutil.which(c) for c in ("g++", "c++", "clang++"))
NERD_RECIPE = REPO / "examples/learning/nerd/configs/cartpole/sl.train.yaml"


def train_and_resume(tmp_path: Path, **changes) -> tuple[Path, Path]:
    common = {"trainer.max_updates": 30, "trainer.save_every": 15, "trainer.validate_every": 15,
              "trainer.log_every": 5, **changes}
    full = write_recipe(tmp_path / "full.yaml", tmp_path / "full", **common)
    assert_ok(run_cli("train-sl", "--config", str(full), "--no-progress"))
    resumed = write_recipe(tmp_path / "resumed.yaml", tmp_path / "resumed", **common)
    assert_ok(run_cli("train-sl", "--config", str(resumed), "--no-progress", "--resume",
                      str(tmp_path / "full" / "step_15.pt")))
    assert assert_training_state_equal(tmp_path / "full" / "last.pt",
                                       tmp_path / "resumed" / "last.pt") > 0
    assert comparable_records(tmp_path / "resumed") == [
        r for r in comparable_records(tmp_path / "full") if r["step"] > 15]
    return tmp_path / "full", tmp_path / "resumed"


@pytest.mark.slow
def test_bf16_on_cpu_trains_and_resumes_exactly(tmp_path: Path) -> None:
    """bf16 autocast on CPU: the run learns, the saved model stays float32, and resuming at 15
    of 30 is bitwise; catches autocast left out (fp32 results) via the loss differing."""
    full, _ = train_and_resume(tmp_path, **{"trainer.precision": "bf16"})
    model = read_checkpoint(full / "last.pt")["payload"]["learner"]["model"]
    assert all(t.dtype == torch.float32 for t in model.values())
    fp32 = write_recipe(tmp_path / "fp32.yaml", tmp_path / "fp32", **{
        "trainer.max_updates": 30, "trainer.save_every": 0, "trainer.validate_every": 15,
        "trainer.log_every": 5})
    assert_ok(run_cli("train-sl", "--config", str(fp32), "--no-progress"))
    loss = {r["step"]: r["train/loss"] for r in comparable_records(full) if "train/loss" in r}
    loss32 = {r["step"]: r["train/loss"] for r in comparable_records(tmp_path / "fp32")
              if "train/loss" in r}
    assert loss[5] != loss32[5] and loss[30] == pytest.approx(loss32[30], rel=0.2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: fp16 is allowed")
@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_fp16_without_cuda_is_refused_before_training(tmp_path: Path, device: str) -> None:
    """`device: cpu` is refused by the recipe check; `device: auto` (resolved to cpu here)
    by the trainer, before anything is written; both exit 2 with the reason."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", device=device,
                          **{"trainer.precision": "fp16"})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert "trainer.precision: fp16 needs a CUDA device" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.skipif(not HAS_COMPILER, reason="torch.compile on CPU needs a C++ compiler")
def test_compile_trains_and_resumes_exactly(tmp_path: Path) -> None:
    """`trainer.compile: true`: trains through torch.compile, saves the unwrapped model (no
    `_orig_mod.` prefixes) and resumes bitwise (the resumed run compiles the same graph)."""
    full, _ = train_and_resume(tmp_path, **{"trainer.compile": True})
    model = read_checkpoint(full / "last.pt")["payload"]["learner"]["model"]
    assert sorted(model) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    mse = [r["validation/mse"] for r in comparable_records(full) if "validation/mse" in r]
    assert len(mse) == 2 and mse[1] < mse[0]


@pytest.fixture(scope="module")
def nerd_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from embodichain_models.dynamics.nerd.prepare import main as prepare

    out = tmp_path_factory.mktemp("nerd-data")
    prepare(["--out", str(out), "--train-trajectories", "40", "--val-trajectories", "8",
             "--steps", "30"])
    return out


def nerd_recipe(tmp_path: Path, data: Path, precision: str | None, trainer_precision=None
                ) -> Path:
    recipe = yaml.safe_load(NERD_RECIPE.read_text())
    recipe.update(factory="nerd", device="cpu")
    recipe["trainer"].pop("precision")
    if precision is not None:
        recipe["precision"] = precision
    if trainer_precision is not None:
        recipe["trainer"]["precision"] = trainer_precision
    recipe["data"] = {"train": str(data / "train.pt"), "val": str(data / "val.pt")}
    recipe["trainer"].update(batch_size=32, max_updates=6, validate_every=6, save_every=3,
                             log_every=3, output_dir=str(tmp_path / "run"))
    recipe["validation"] = {"horizons": [1, 5]}
    path = tmp_path / "nerd.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_nerd_precision_is_a_deprecated_alias_of_trainer_precision(tmp_path: Path,
                                                                   nerd_data: Path) -> None:
    """NeRD's `precision: bf16` sets trainer.precision (shown by --print-config, trained in
    bf16, exact as before); contradicting trainer.precision is refused."""
    recipe = nerd_recipe(tmp_path, nerd_data, "bf16")
    shown = run_cli("train-sl", "--config", str(recipe), "--print-config")
    assert_ok(shown)
    assert yaml.safe_load(shown.stdout)["trainer"]["precision"] == "bf16"
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    saved = read_checkpoint(tmp_path / "run" / "last.pt")["payload"]["run"]["config"]
    assert saved["trainer"]["precision"] == "bf16"
    both = nerd_recipe(tmp_path, nerd_data, "bf16", trainer_precision="fp16")
    both.write_text(both.read_text().replace("device: cpu", "device: cuda"))  # fp16 allowed
    proc = cli_in_process("validate-config", str(both))
    assert proc.returncode == 2 and "contradicts trainer.precision: fp16" in proc.stdout + \
        proc.stderr
