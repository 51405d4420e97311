"""An ALOHA recipe over several training seeds, reported on test seeds (R-TRUST-2, R-TRUST-3).

    python benchmarks/aloha_seeds.py train RECIPE --seeds 0 1 2 --out outputs/seeds [--nproc 2]
    python benchmarks/aloha_seeds.py report RUN_DIR [RUN_DIR ...] [--test-seed 200000]
                                     [--episodes 50] [--nproc 2] [--checkpoint best.pt]

`train`: the recipe trained once per seed (`--set seed=S`, `trainer.output_dir=OUT/seed_S`,
torchrun on `--nproc` CPU processes, OMP_NUM_THREADS=1), one after another; each run's
wall time is printed (the recipes' budget is 60 minutes each on 2 CPU cores). `report`:
for each run, `embodichain eval RUN/best.pt` (chosen on the validation seeds by the strict
verdict) on the test seeds (`--test-seed`, default the recipe's `evaluation.test_seed`,
else 200000), kept under `RUN/evaluations/test_<seed>_<episodes>/` and reused when there;
then a row per training seed (the field's and the strict verdict, each k/n with its Wilson
95% interval, at the recipe's limit and at 300 steps, the training time) and, over the
seeds, mean ± sd (sample standard deviation) of each rate. `--json FILE` writes the rows.
Needs `pip install 'embodichain-models[sim]'`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import bench_env, torchrun

from embodichain.core.evaluation.intervals import rate_with_interval, successes_of

VERDICTS = {"field": "validation/success_rate", "strict": "validation/strict_success_rate",
            "field_300": "validation/success_300_rate",
            "strict_300": "validation/strict_success_300_rate"}


def train(recipe: Path, seeds: list[int], out: Path, nproc: int) -> None:
    for seed in seeds:
        run = out / f"seed_{seed}"
        command = torchrun("-m", "embodichain", "train-sl", "--config", str(recipe), "--set",
                           f"seed={seed}", "--set", f"trainer.output_dir={run}",
                           "--no-progress", nproc=nproc)
        started = time.perf_counter()
        proc = subprocess.run(command, env=bench_env())
        minutes = (time.perf_counter() - started) / 60
        print(f"seed {seed}: {run} trained in {minutes:.1f} min wall on {nproc} processes "
              f"({os.cpu_count()} CPUs), exit {proc.returncode}", flush=True)
        if proc.returncode != 0:
            raise SystemExit(proc.returncode)


def _recipe(run: Path) -> dict[str, Any]:
    return json.loads((run / "run.json").read_text())["config"]


def evaluate(run: Path, checkpoint: str, test_seed: int | None, episodes: int | None,
             nproc: int) -> dict[str, Any]:
    """The run's summary.json on the test seeds (evaluated once, then reused)."""
    section = _recipe(run)["evaluation"]
    seed = test_seed if test_seed is not None else section.get("test_seed") or 200_000
    count = episodes or section.get("test_episodes") or section.get("episodes", 50)
    out = run / "evaluations" / f"test_{seed}_{count}"
    if not (out / "summary.json").is_file():
        command = [sys.executable, "-m", "embodichain", "eval", str(run / checkpoint),
                   "--seed", str(seed), "--episodes", str(count), "--videos", "0",
                   "--out", str(out), "--no-progress"]
        if nproc > 1:
            command += ["--nproc-per-node", str(nproc)]
        proc = subprocess.run(command, env=bench_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{run}: eval failed (exit {proc.returncode}):\n{proc.stderr}")
    return json.loads((out / "summary.json").read_text())


def training_minutes(run: Path) -> float | None:
    """Wall minutes from the start to the last update (evaluations included)."""
    times = [r["time/elapsed_s"] for r in map(json.loads, (run / "metrics.jsonl").open())
             if "time/elapsed_s" in r]
    return max(times) / 60 if times else None


def row(run: Path, summary: dict[str, Any]) -> dict[str, Any]:
    n = int(summary["episodes"])
    found = {"run": str(run), "training_seed": _recipe(run).get("seed"),
             "checkpoint": summary.get("checkpoint"), "update": summary.get("step"),
             "test_seeds": summary.get("seeds"), "seed_role": summary.get("seed_role"),
             "episodes": n, "training_min": training_minutes(run)}
    for name, key in VERDICTS.items():
        if key in summary["metrics"]:
            rate = summary["metrics"][key]
            found[name] = {"rate": rate, "successes": successes_of(rate, n),
                           "interval": summary["intervals"][key]}
    return found


def spread(rows: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Mean and sample standard deviation of each verdict's rate over the rows (sd 0 for
    one row)."""
    found = {}
    for name in VERDICTS:
        rates = [r[name]["rate"] for r in rows if name in r]
        if rates:
            found[name] = (statistics.fmean(rates),
                           statistics.stdev(rates) if len(rates) > 1 else 0.0)
    return found


def report(runs: list[Path], checkpoint: str, test_seed: int | None, episodes: int | None,
           nproc: int, json_out: Path | None) -> None:
    rows = [row(run, evaluate(run, checkpoint, test_seed, episodes, nproc)) for run in runs]
    for r in rows:
        cells = [f"{name} {rate_with_interval(r[name]['successes'], r['episodes'])}"
                 for name in VERDICTS if name in r]
        took = f"{r['training_min']:.0f} min" if r["training_min"] is not None else "?"
        print(f"training seed {r['training_seed']} ({r['run']}, update {r['update']}, "
              f"{r['seed_role']} seeds {r['test_seeds']}; trained in {took}): "
              + "; ".join(cells))
    over = spread(rows)
    print(f"over {len(rows)} training seed(s): " + "; ".join(
        f"{name} {100 * mean:.1f}% ± {100 * sd:.1f}" for name, (mean, sd) in over.items()))
    if json_out is not None:
        json_out.write_text(json.dumps({"rows": rows, "mean_sd": over}, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train")
    t.add_argument("recipe", type=Path)
    t.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--nproc", type=int, default=2)
    r = sub.add_parser("report")
    r.add_argument("runs", type=Path, nargs="+")
    r.add_argument("--checkpoint", default="best.pt")
    r.add_argument("--test-seed", type=int)
    r.add_argument("--episodes", type=int)
    r.add_argument("--nproc", type=int, default=2)
    r.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.what == "train":
        train(args.recipe, args.seeds, args.out, args.nproc)
    else:
        report(args.runs, args.checkpoint, args.test_seed, args.episodes, args.nproc,
               args.json)


if __name__ == "__main__":
    main()
