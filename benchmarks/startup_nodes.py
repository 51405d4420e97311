"""Wall time of a 10-update sl_ddp run, start-up dominated: one node with 2 workers
(torchrun --standalone), two torchrun agents with 1 worker each (static rendezvous, each in
its own working directory) and the self-launch (`--nproc-per-node 2`), interleaved.

    python benchmarks/startup_nodes.py 5
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import CPU_RECIPE, bench_env

RECIPE = yaml.safe_load(CPU_RECIPE.read_text())
RECIPE["trainer"].update(max_updates=10, save_every=10, validate_every=10, log_every=10,
                         output_dir="outputs/run")
ENV = bench_env()
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = ["-m", "embodichain", "train-sl", "--config", "r.yaml", "--no-progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(commands: list[tuple[list[str], Path]]) -> float:
    """Start the commands together (each in its directory, with the recipe); wall time."""
    for _, cwd in commands:
        cwd.mkdir(exist_ok=True)
        (cwd / "r.yaml").write_text(yaml.safe_dump(RECIPE))
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for cmd, cwd in commands]
    if any(p.wait() != 0 for p in procs):
        sys.exit(f"failed: {commands}")
    return time.perf_counter() - start


def one_node(root: Path) -> float:
    return _timed([([*TORCHRUN, "--standalone", "--nproc-per-node=2", *TRAIN], root)])


def two_nodes(root: Path) -> float:
    port = _free_port()
    return _timed([([*TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}",
                     "--master-addr=127.0.0.1", f"--master-port={port}", *TRAIN],
                    root / f"node{node}") for node in (0, 1)])


def self_launch(root: Path) -> float:
    return _timed([([sys.executable, *TRAIN, "--nproc-per-node", "2"], root)])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    launches = {"1 node x 2 workers, torchrun --standalone": one_node,
                "2 nodes x 1 worker, static rendezvous": two_nodes,
                "1 node x 2 workers, --nproc-per-node 2": self_launch}
    times: dict[str, list[float]] = {name: [] for name in launches}
    for _ in range(rounds):
        for name, launch in launches.items():
            with tempfile.TemporaryDirectory() as d:
                times[name].append(launch(Path(d)))
    for name, values in times.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name}: median {statistics.median(values):.2f} s ({shown})")


if __name__ == "__main__":
    main()
