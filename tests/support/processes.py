"""Paths of the test tree and the processes tests start: the CLI, torchrun, a live run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import child_pids as child_pids  # one /proc walk for both

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"  # helper scripts that tests launch
FACTORIES = TESTS / "factories"  # test-only recipe factories
CPU_RECIPE = REPO / "examples" / "learning" / "sl_ddp" / "cpu.yaml"
TIMEOUT = 300


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.update(extra)
    return env


def factories_env(**extra: str) -> dict[str, str]:
    """Worker environment in which the test factories of tests/factories resolve."""
    return worker_env(PYTHONPATH=str(FACTORIES), **extra)


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """`python -m embodichain ARGS` in one process."""
    return subprocess.run([sys.executable, "-m", "embodichain", *args], cwd=cwd or REPO,
                          env=env or worker_env(), capture_output=True, text=True,
                          timeout=timeout)


def run_torchrun(*args: str, nproc: int = 2, cwd: Path | None = None,
                 env: dict[str, str] | None = None, timeout: float = TIMEOUT,
                 module: str = "embodichain") -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc-per-node=N -m embodichain ARGS` (gloo CPU workers)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           f"--nproc-per-node={nproc}", "-m", module, *args]
    return subprocess.run(cmd, cwd=cwd or REPO, env=env or worker_env(), capture_output=True,
                          text=True, timeout=timeout)


def start_endless_run(tmp_path: Path, run: Path, stdout: int = subprocess.DEVNULL
                      ) -> subprocess.Popen[str]:
    """One process training the example "forever" (10M updates) into `run`, saving every
    500 updates, in the background: a live run for a test to look at, signal or kill."""
    from tests.support.recipes import write_recipe

    recipe = write_recipe(tmp_path / "endless.yaml", run, **{
        "trainer.max_updates": 10_000_000, "trainer.save_every": 500,
        "trainer.validate_every": 0, "trainer.log_every": 50})
    return subprocess.Popen([sys.executable, "-m", "embodichain", "train-sl", "--config",
                             str(recipe), "--no-progress"], cwd=REPO, env=worker_env(),
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n" \
                                 f"stderr:\n{proc.stderr}"


def workers_output(output: str) -> str:
    """What the workers printed under torchrun: the output before torchrun's own failure
    report, which repeats each worker's message from its elastic error file (design §9)."""
    return output.split("Traceback (most recent call last):", 1)[0]
