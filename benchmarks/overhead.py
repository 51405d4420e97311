"""Per-update and whole-process cost of `train-sl` against the hand-written DDP loop.

Both run the sl_ddp example with 2 gloo workers under torchrun, alternating
(framework, raw, framework, raw, ...) so that machine noise hits both alike. Reported:

- per-update ratio: steady state inside the process, the median over 10-update windows of
  the wall time per update (windows that contain validation or a save are outliers the median
  ignores);
- whole-process ratio: wall time of the whole `torchrun` command, start-up included.

    python benchmarks/overhead.py --pairs 5 --updates 200 2000
    python benchmarks/overhead.py --pairs 5 --updates 2000 --baseline-ref 48f63ee

`--baseline-ref REF` adds a third run to every group: train-sl as of git commit REF (from a
temporary worktree), so that the cost of a change is measured side by side with the code
before it.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import CPU_RECIPE, REPO, baseline_tree, bench_env, seconds_per_update
from common import torchrun as torchrun_command


def torchrun(*args: str, pythonpath: Path | None = None) -> float:
    # pythonpath: import embodichain from another tree (the baseline)
    env = bench_env(pythonpath) if pythonpath is not None else bench_env()
    cmd = torchrun_command(*args)
    start = time.perf_counter()
    # Not from the checkout: `python -m` puts the working directory first on sys.path, ahead
    # of PYTHONPATH, so a baseline tree's embodichain would lose to the checkout's.
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
    return elapsed


def framework_run(work: Path, updates: int, tree: Path | None = None) -> tuple[float, float]:
    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    recipe["trainer"].update(max_updates=updates, output_dir=str(work / "run"))
    (work / "r.yaml").write_text(yaml.safe_dump(recipe))
    wall = torchrun("-m", "embodichain", "train-sl", "--config", str(work / "r.yaml"),
                    "--no-progress", pythonpath=tree)
    return wall, seconds_per_update(work / "run" / "metrics.jsonl")


def raw_run(work: Path, updates: int) -> tuple[float, float]:
    wall = torchrun(str(REPO / "benchmarks" / "raw_ddp_loop.py"), "--out", str(work),
                    "--max-updates", str(updates))
    return wall, seconds_per_update(work / "metrics.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--updates", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--baseline-ref", help="also run train-sl as of this git commit")
    args = parser.parse_args()
    with baseline_tree(args.baseline_ref) as baseline:
        measure(args.updates, args.pairs, baseline)


def measure(sizes: list[int], pairs: int, baseline: Path | None) -> None:
    results = {}
    for updates in sizes:
        step_ratios, wall_ratios, base_ratios = [], [], []
        for pair in range(pairs):
            with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
                fw_wall, fw_step = framework_run(Path(a), updates)
                raw_wall, raw_step = raw_run(Path(b), updates)
            step_ratios.append(fw_step / raw_step)
            wall_ratios.append(fw_wall / raw_wall)
            line = (f"{updates} updates, pair {pair + 1}: per-update {fw_step * 1e3:.3f} ms vs "
                    f"{raw_step * 1e3:.3f} ms ({step_ratios[-1]:.3f}x); whole process "
                    f"{fw_wall:.2f} s vs {raw_wall:.2f} s ({wall_ratios[-1]:.3f}x)")
            if baseline is not None:
                with tempfile.TemporaryDirectory() as c:
                    _, base_step = framework_run(Path(c), updates, baseline)
                base_ratios.append(fw_step / base_step)
                line += f"; baseline {base_step * 1e3:.3f} ms ({base_ratios[-1]:.3f}x)"
            print(line, flush=True)
        results[updates] = (statistics.median(step_ratios), statistics.median(wall_ratios),
                            statistics.median(base_ratios) if base_ratios else None)
    print("\nmedians (train-sl / raw DDP loop, 2 gloo workers):")
    for updates, (step, wall, base) in results.items():
        extra = f"; per-update against the baseline {base:.3f}x" if base is not None else ""
        print(f"  {updates:>5} updates: per-update {step:.3f}x, whole process {wall:.3f}x"
              f"{extra}")


if __name__ == "__main__":
    main()
