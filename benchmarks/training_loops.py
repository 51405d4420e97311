"""Costs of the training loops (R-LOOP-1, -2, -4), each side by side in one run:

- `rss`: peak resident memory of accumulation K=4 x batch 64 against K=1 x batch 256 on a
  model whose activations dominate (a per-token MLP over 128 tokens per example), one fresh
  process per measurement, alternating. Reported: peak RSS, and its growth over the RSS
  before the first update (torch, model and data loaded).
- `ema`: per-update time of the NeRD recipe with and without `trainer.ema`, alternating.
- `ema-in-process`: the same, in one process, alternating blocks of updates (less noise).
- `compile`: per-update time of the NeRD recipe with `trainer.compile: true` against eager.

Per-update times come from `time/elapsed_s` of metrics.jsonl between update `--warmup` and
the last (so start-up and compilation are excluded); no validation, no saves in between.

    python benchmarks/training_loops.py rss --repeats 3
    python benchmarks/training_loops.py ema compile --repeats 3 --updates 300
    python benchmarks/training_loops.py ema-in-process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NERD = REPO / "examples/learning/nerd/configs/cartpole/sl.train.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

_RSS_CHILD = r"""
import resource, sys, torch
from torch import nn
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.core.data.micro_batches import MicroBatches
from embodichain.learning.sl import Learner, LossResult
torch.set_num_threads(1)
k, batch = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
# Per token MLP over 128 tokens per example: ~2 MB of saved activations per example against
# 2 MB of weights in all, so memory is activations.
width, depth, tokens = 256, 8, 128
layers = [nn.Linear(64, width), nn.GELU()]
for _ in range(depth):
    layers += [nn.Linear(width, width), nn.GELU()]
model = nn.Sequential(*layers, nn.Linear(width, 1))
data = {"x": torch.randn(k * batch, tokens, 64), "y": torch.randn(k * batch, tokens, 1)}
def mse(m, b):
    return LossResult(loss=(m(b["x"]) - b["y"]).square().mean(), weight=float(len(b["x"])))
learner = Learner(model, OptimizerConfig(name="sgd", lr=1e-3), None, 10, torch.device("cpu"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # model, data, optimizer built
for _ in range(3):
    learner.update(mse, MicroBatches(torch.arange(k * batch), batch,
                                     lambda i: {n: t[i] for n, t in data.items()}))
print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def rss(repeats: int) -> None:
    """Peak RSS (KiB, ru_maxrss on Linux) of K=4 x 64 and K=1 x 256, alternating."""
    results: dict[str, list[tuple[int, int]]] = {"K=4 x 64": [], "K=1 x 256": []}
    for _ in range(repeats):
        for name, (k, b) in (("K=4 x 64", (4, 64)), ("K=1 x 256", (1, 256))):
            out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(k), str(b)], env=ENV,
                                 check=True, capture_output=True, text=True).stdout.split()
            results[name].append((int(out[0]), int(out[1])))
    print("| configuration | peak RSS (MiB, median) | growth over the RSS before training (MiB) |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        peak = statistics.median(p for _, p in runs) / 1024
        growth = statistics.median(p - w for w, p in runs) / 1024
        print(f"| {name} | {peak:.0f} | {growth:.0f} |")


def nerd_per_update(data: Path, out: Path, updates: int, warmup: int, *sets: str) -> float:
    """Seconds per update of a NeRD CLI run, between update `warmup` and the last."""
    cmd = [sys.executable, "-m", "embodichain", "train-sl", "--config", str(NERD),
           "--no-progress", "--set", "device=cpu", "--set", f"data.train={data / 'train.pt'}",
           "--set", f"data.val={data / 'val.pt'}", "--set", f"trainer.max_updates={updates}",
           "--set", "trainer.validate_every=0", "--set", "trainer.save_every=0",
           "--set", "trainer.log_every=50", "--set", f"trainer.output_dir={out}"]
    for s in sets:
        cmd += ["--set", s]
    subprocess.run(cmd, env=ENV, check=True, capture_output=True, cwd=REPO)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = {r["step"]: r["time/elapsed_s"] for r in records if "time/elapsed_s" in r}
    return (elapsed[updates] - elapsed[warmup]) / (updates - warmup)


def nerd(kinds: list[str], repeats: int, updates: int, warmup: int) -> None:
    variants = {"eager": ()}
    if "ema" in kinds:
        variants["eager + EMA"] = ("trainer.ema.decay=0.999",)
    if "compile" in kinds:
        variants["compile"] = ("trainer.compile=true",)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        subprocess.run([sys.executable, "-m", "embodichain_models.dynamics.nerd.prepare",
                        "--out", str(data)], env=ENV, check=True, capture_output=True)
        times: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(repeats):
            for name, sets in variants.items():
                out = Path(tmp) / f"{name.replace(' ', '_')}_{i}"
                times[name].append(nerd_per_update(data, out, updates, warmup, *sets))
    base = statistics.median(times["eager"])
    print(f"| NeRD recipe (batch 256, CPU) | per update (median of {repeats}) | vs eager |")
    print("|---|---:|---:|")
    for name, values in times.items():
        med = statistics.median(values)
        ratios = [v / e for v, e in zip(values, times["eager"], strict=True)]
        print(f"| {name} | {med * 1000:.2f} ms | {med / base:.3f}x "
              f"(pairs {min(ratios):.3f}-{max(ratios):.3f}) |")


_EMA_CHILD = r"""
import sys, time, statistics, torch
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.learning.sl import Learner, LossResult
from embodichain_models.dynamics.nerd.model import NerdModelConfig, NerdTransformer
torch.set_num_threads(1)
blocks, per_block = int(sys.argv[1]), int(sys.argv[2])
cfg = NerdModelConfig(layers=2, d_model=64, heads=4, window=10, causal=True, dropout=0.0,
                      norm_eps=1e-5)
g = torch.Generator().manual_seed(0)
batch = {"states": torch.randn(256, 10, 4, generator=g),
         "actions": torch.randn(256, 10, 2, generator=g),
         "target": torch.randn(256, 10, 4, generator=g)}
def mse(model, b):
    loss = (model(b["states"], b["actions"]).float() - b["target"]).square().mean()
    return LossResult(loss=loss, weight=float(b["target"].numel()))
learners = {name: Learner(NerdTransformer(cfg), OptimizerConfig(name="adam", lr=1e-3), None,
                          10**6, torch.device("cpu"), ema_decay=decay)
            for name, decay in (("eager", None), ("eager + EMA", 0.999))}
times = {name: [] for name in learners}
for i in range(blocks + 1):  # block 0 is warm-up
    for name, learner in learners.items():
        start = time.perf_counter()
        for _ in range(per_block):
            learner.update(mse, batch)
        if i:
            times[name].append((time.perf_counter() - start) / per_block)
print(*(statistics.median(v) for v in times.values()))
print(*(min(e / b for e, b in zip(times["eager + EMA"], times["eager"]))
        for _ in [0]), max(e / b for e, b in zip(times["eager + EMA"], times["eager"])))
"""


def ema_in_process(blocks: int = 10, per_block: int = 20) -> None:
    """The NeRD model's update with and without EMA in one process, alternating blocks of
    updates (less noise than separate processes on a busy machine)."""
    out = subprocess.run([sys.executable, "-c", _EMA_CHILD, str(blocks), str(per_block)],
                         env=ENV, check=True, capture_output=True, text=True).stdout.split()
    eager, ema, low, high = map(float, out)
    print(f"| NeRD model update, one process, {blocks} alternating blocks of {per_block} "
          "| per update (median) | vs eager |")
    print("|---|---:|---:|")
    print(f"| eager | {eager * 1000:.2f} ms | 1.000x |")
    print(f"| eager + EMA | {ema * 1000:.2f} ms | {ema / eager:.3f}x "
          f"(blocks {low:.3f}-{high:.3f}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="+", choices=["rss", "ema", "compile",
                                                          "ema-in-process"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    args = parser.parse_args()
    if "rss" in args.what:
        rss(args.repeats)
    if "ema-in-process" in args.what:
        ema_in_process()
    kinds = [k for k in args.what if k in ("ema", "compile")]
    if kinds:
        nerd(kinds, args.repeats, args.updates, args.warmup)


if __name__ == "__main__":
    main()
