"""Per-update and whole-process cost of `train-sl` against the hand-written DDP loop.

Both run the sl_ddp example with 2 gloo workers under torchrun, alternating
(framework, raw, framework, raw, ...) so that machine noise hits both alike. Reported:

- per-update ratio: steady state inside the process, the median over 10-update windows of
  the wall time per update (windows that contain validation or a save are outliers the median
  ignores);
- whole-process ratio: wall time of the whole `torchrun` command, start-up included.

    python benchmarks/overhead.py --pairs 5 --updates 200 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "learning" / "sl_ddp" / "cpu.yaml"


def torchrun(*args: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
           "--nproc-per-node=2", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
    return elapsed


def seconds_per_update(metrics: Path) -> float:
    """Median wall time per update over the logged 10-update windows."""
    points = [(r["step"], r["time/elapsed_s"]) for r in map(json.loads, metrics.open())
              if "time/elapsed_s" in r]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(points, points[1:],
                                                                  strict=False)]
    return statistics.median(rates)


def framework_run(work: Path, updates: int) -> tuple[float, float]:
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["trainer"].update(max_updates=updates, output_dir=str(work / "run"))
    (work / "r.yaml").write_text(yaml.safe_dump(recipe))
    wall = torchrun("-m", "embodichain", "train-sl", "--config", str(work / "r.yaml"))
    return wall, seconds_per_update(work / "run" / "metrics.jsonl")


def raw_run(work: Path, updates: int) -> tuple[float, float]:
    wall = torchrun(str(REPO / "benchmarks" / "raw_ddp_loop.py"), "--out", str(work),
                    "--max-updates", str(updates))
    return wall, seconds_per_update(work / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--updates", type=int, nargs="+", default=[200, 2000])
    args = parser.parse_args()
    results = {}
    for updates in args.updates:
        step_ratios, wall_ratios = [], []
        for pair in range(args.pairs):
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                fw_wall, fw_step = framework_run(Path(a), updates)
                raw_wall, raw_step = raw_run(Path(b), updates)
            step_ratios.append(fw_step / raw_step)
            wall_ratios.append(fw_wall / raw_wall)
            print(f"{updates} updates, pair {pair + 1}: per-update {fw_step * 1e3:.3f} ms vs "
                  f"{raw_step * 1e3:.3f} ms ({step_ratios[-1]:.3f}x); whole process "
                  f"{fw_wall:.2f} s vs {raw_wall:.2f} s ({wall_ratios[-1]:.3f}x)", flush=True)
        results[updates] = (statistics.median(step_ratios), statistics.median(wall_ratios))
    print("\nmedians (train-sl / raw DDP loop, 2 gloo workers):")
    for updates, (step, wall) in results.items():
        print(f"  {updates:>5} updates: per-update {step:.3f}x, whole process {wall:.3f}x")


if __name__ == "__main__":
    main()
