"""NumPy is not a dependency: training, checkpoints and exact resume work without it (R-CKPT-1).

The suite's own environment has NumPy (the dev extra installs it, so the checkpointed NumPy
RNG path is tested elsewhere); here a shim on PYTHONPATH makes `import numpy` fail in the
workers, as on a machine where it was never installed. Two torchrun workers, so that the
object collectives (torch's own need NumPy) are covered too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support import assert_ok, run_torchrun, worker_env, write_recipe
from tests.support.recovery import assert_training_state_equal, metrics, without_time


def _no_numpy_env(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "shim" / "numpy"
    shim.mkdir(parents=True)
    # ModuleNotFoundError, as a missing package raises: torch only tolerates that one.
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    return worker_env(PYTHONPATH=str(shim.parent))


# Everything a training run imports, the built-in recipes' factories included.
TRAINING_IMPORTS = ("embodichain.core.training.trainer", "embodichain.plugins.sl_ddp",
                    "embodichain.cli")


def test_the_training_modules_import_without_numpy(tmp_path: Path) -> None:
    """A quick guard for the slow test below: catches a module-level `import numpy` in
    anything training imports (the evaluation's admission once had one, and every run on a
    machine without NumPy failed at its factory's import)."""
    code = "import importlib, sys\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in TRAINING_IMPORTS)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True,
                          text=True, env=_no_numpy_env(tmp_path), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow  # launches torchrun workers
def test_exact_resume_without_numpy(tmp_path: Path) -> None:
    env = _no_numpy_env(tmp_path)
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "full", **{
        "trainer.max_updates": 40, "trainer.save_every": 20, "trainer.validate_every": 20})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env))
    full = tmp_path / "full"
    for rank in (0, 1):
        saved = read_checkpoint(full / "step_20.pt")["payload"]["ranks"][rank]["rng"]
        assert saved["numpy"] is None and saved["python"] is not None

    resumed = tmp_path / "resumed"
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume",
                           str(full / "step_20.pt"), "--set", f"trainer.output_dir={resumed}",
                           "--no-progress", env=env))
    assert assert_training_state_equal(full / "last.pt", resumed / "last.pt") > 0
    after = [r for r in without_time(metrics(full)) if r["step"] > 20]
    assert without_time(metrics(resumed)) == after
