"""Helpers every benchmark uses: the environment, torchrun, per-update time, child processes.

Benchmarks run as scripts (`python benchmarks/NAME.py`), so this directory is first on
sys.path and they import `from common import ...`. The tests' /proc walk is this one too.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
CPU_RECIPE = REPO / "examples" / "learning" / "sl_ddp" / "cpu.yaml"
TEST_FACTORIES = REPO / "tests" / "factories"


def bench_env(*pythonpath: Path, **extra: str) -> dict[str, str]:
    """This environment with one thread per process and `pythonpath` first on PYTHONPATH."""
    parts = [str(p) for p in pythonpath] + [os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in parts if p)
    return env


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """The command `torchrun --standalone --nproc-per-node=NPROC ARGS` (one node)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", *args]


def seconds_per_update(metrics: Path) -> float:
    """Median wall time per update over the logged windows of `metrics` (a metrics.jsonl):
    windows that contain validation or a save are outliers the median ignores."""
    points = [(r["step"], r["time/elapsed_s"]) for r in map(json.loads, metrics.open())
              if "time/elapsed_s" in r]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(points, points[1:],
                                                                  strict=False)]
    return statistics.median(rates)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid`, read from /proc (torch's agent and DataLoader
    start theirs directly, with no shell in between)."""
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


# -- a wide MLP recipe for the checkpoint benchmarks (async_save.py, fsdp.py) ----------------


def wide_mlp_schema():
    """The recipe sections of a benchmark factory: `model: {width, depth}` and sl_ddp's data."""
    from embodichain.learning.sl import Section
    from embodichain.plugins.sl_ddp_schema import DataConfig

    class Model(Section):
        width: int
        depth: int

    class BenchConfig(Section):
        model: Model
        data: DataConfig

    return BenchConfig


def wide_mlp(width: int, depth: int):
    """4 -> width -> ... (depth hidden layers) -> 2, with Tanh: sl_ddp's model, made large."""
    from torch import nn

    layers: list[nn.Module] = [nn.Linear(4, width), nn.Tanh()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 2))


@contextmanager
def baseline_tree(ref: str | None) -> Iterator[Path | None]:
    """The checkout as of git commit `ref` in a temporary worktree (removed after), for a
    benchmark that runs an older train-sl beside the current one; None without a ref."""
    if ref is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as trees:
        baseline = Path(trees) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(baseline), ref], cwd=REPO,
                       check=True, capture_output=True)
        try:
            yield baseline
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=REPO,
                           check=False)
