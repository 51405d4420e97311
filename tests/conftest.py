"""Shared helpers and the expensive runs that several tests read (run once per session)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent
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


def write_recipe(path: Path, output_dir: Path, base: Path = CPU_RECIPE, **changes: object
                 ) -> Path:
    """A copy of `base` writing to `output_dir`, with dotted-key changes applied."""
    data = yaml.safe_load(base.read_text())
    data["trainer"]["output_dir"] = str(output_dir)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__") if "__" in dotted else dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_endless_run(tmp_path: Path, run: Path, stdout: int = subprocess.DEVNULL
                      ) -> subprocess.Popen[str]:
    """One process training the example "forever" (10M updates) into `run`, saving every
    500 updates, in the background: a live run for a test to look at, signal or kill."""
    recipe = write_recipe(tmp_path / "endless.yaml", run, **{
        "trainer.max_updates": 10_000_000, "trainer.save_every": 500,
        "trainer.validate_every": 0, "trainer.log_every": 50})
    return subprocess.Popen([sys.executable, "-m", "embodichain", "train-sl", "--config",
                             str(recipe), "--no-progress"], cwd=REPO, env=worker_env(),
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid`, read from /proc (torch's agent starts its workers
    directly, with no shell in between)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def snapshot_dir(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None), to assert that a refused command
    changed nothing: a file or a directory it created, removed or changed shows."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


def tensors_by_path(value: object, path: str = ""):
    """Every tensor of a nested checkpoint payload, keyed like `/learner/model/0.weight`."""
    import torch

    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key in value:
            yield from tensors_by_path(value[key], f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from tensors_by_path(item, f"{path}/{i}")


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n" \
                                 f"stderr:\n{proc.stderr}"


def workers_output(output: str) -> str:
    """What the workers printed under torchrun: the output before torchrun's own failure
    report, which repeats each worker's message from its elastic error file (SPEC §9)."""
    return output.split("Traceback (most recent call last):", 1)[0]


def _train_example(root: Path, launch) -> Path:
    recipe = write_recipe(root / "cpu.yaml", root / "run")
    proc = launch("train-sl", "--config", str(recipe), "--no-progress")
    assert_ok(proc)
    # What the run printed, beside (not inside) its directory, for tests of the output.
    (root / "stdout.txt").write_text(proc.stdout)
    (root / "stderr.txt").write_text(proc.stderr)
    return root / "run"


@pytest.fixture(scope="session")
def sl_ddp_two_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe trained to 200 updates by 2 torchrun workers (shared, read-only)."""
    return _train_example(tmp_path_factory.mktemp("sl_ddp_2w"), run_torchrun)


@pytest.fixture(scope="session")
def sl_ddp_one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe trained to 200 updates in one process (shared, read-only)."""
    return _train_example(tmp_path_factory.mktemp("sl_ddp_1p"), run_cli)


@pytest.fixture()
def copy_run(tmp_path: Path):
    """Copy a shared run directory before a test modifies it."""
    def copy(src: Path, name: str = "run") -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst
    return copy


# -- runs that several test files share (each trained once per session, read-only) -------------

# The recovery-by-restart recipe (tests/factories/restarting.py: sl_ddp with test-controlled
# kills, pauses and blocks; without them it trains exactly like sl_ddp).
RESTART_RECIPE = {"factory": "restarting:build_supervised_trainer", "trainer.max_updates": 300,
                  "trainer.save_every": 40, "trainer.validate_every": 50, "trainer.log_every": 10}


def factories_env(**extra: str) -> dict[str, str]:
    """Worker environment in which the test factories of tests/factories resolve."""
    return worker_env(PYTHONPATH=str(FACTORIES), **extra)


@pytest.fixture(scope="session")
def restart_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RESTART_RECIPE trained to 300 updates by 2 torchrun workers without interruption: the
    reference of every recovery-by-restart and multi-node scenario (shared, read-only)."""
    root = tmp_path_factory.mktemp("restart_reference")
    recipe = write_recipe(root / "r.yaml", root / "run", **RESTART_RECIPE)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=factories_env()))
    return root / "run"


@pytest.fixture(scope="session")
def resumed_at_100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe (with the TensorBoard logger too) trained in one process to
    update 100, then continued in place by `resume --set trainer.max_updates=200`.
    `at_100/` is a copy of the run as it was at update 100, `run/` the continued run
    (shared, read-only)."""
    root = tmp_path_factory.mktemp("resumed_at_100")
    run = root / "run"
    recipe = write_recipe(root / "r.yaml", run, **{"trainer.loggers": ["jsonl", "tensorboard"],
                                                   "trainer.max_updates": 100})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    shutil.copytree(run, root / "at_100")
    assert_ok(run_cli("resume", str(run), "--set", "trainer.max_updates=200", "--no-progress"))
    return root


@pytest.fixture(scope="session")
def endless_run_stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """`start_endless_run` into `outputs/live`, looked at by `embodichain runs` while it is
    live (once step_500.pt exists and the lock names its holder), then stopped by SIGTERM.
    Returns what each step saw: `run`, `pid`, `live_json` and `live_table` (the `runs`
    outputs while live), `returncode`, `stdout`, `stderr` (shared, read-only)."""
    import json
    import signal
    import time

    from embodichain.core.runs.run_lock import lock_holder

    root = tmp_path_factory.mktemp("endless")
    run = root / "outputs" / "live"
    proc = start_endless_run(root, run, stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not ((run / "step_500.pt").exists() and lock_holder(run)):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the endless run never saved step_500.pt"
            time.sleep(0.2)
        listed = run_cli("runs", str(run.parent), "--json")
        table = run_cli("runs", str(run.parent), env=worker_env(COLUMNS="200"))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_ok(listed)
    assert_ok(table)
    return {"run": run, "pid": proc.pid, "live_json": json.loads(listed.stdout),
            "live_table": table.stdout, "returncode": proc.returncode, "stdout": out,
            "stderr": err}
