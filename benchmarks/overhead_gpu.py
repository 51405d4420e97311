"""Per-update cost of `train-sl` on one GPU against two hand-written loops (R-GPU-2).

The model is a wide MLP (4 -> width -> `depth` hidden width x width layers -> 2, Tanh) on
sl_ddp's synthetic corpus (65536 examples, the masked weighted MSE), Adam at lr 1e-3, one
process. Four ways of training it, each in a fresh process, alternating (train-sl,
DataLoader loop, GPU-resident loop, train-sl compiled, then again), so that machine noise
hits all alike:

- `train-sl`: the real CLI, the corpus resident on the device (as sl_ddp's factory puts it);
- `train-sl compile`: the same with `trainer.compile: true`;
- `dataloader`: the loop users write: torch's DataLoader over the corpus in host memory
  (shuffled, pinned), each batch copied to the device;
- `resident`: the loop that keeps the GPU fed: the corpus on the device, a permutation
  drawn on the device each epoch, batches sliced from it.

Reported per update: the steady state between update `--warmup` and `--updates` (the time
of the device's work included: train-sl's figures at those updates are logged, so read
once the device has done them; the hand loops synchronise there). The goal is train-sl
within 1.05x the resident loop at both sizes.

    python benchmarks/overhead_gpu.py                          # both sizes, 3 rounds
    python benchmarks/overhead_gpu.py --device cpu --updates 60 --warmup 20 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import wide_mlp, wide_mlp_schema

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SIZES = {"small": (256, 2, 256), "large": (2048, 4, 1024)}  # width, depth, batch
CORPUS = 65536
KINDS = ("train-sl", "dataloader", "resident", "train-sl compile")


# -- train-sl's factory: the wide MLP on sl_ddp's corpus, resident on the device -----------


def build_supervised_trainer(config, device):
    from embodichain.learning.sl import SupervisedTrainer, TensorSource
    from embodichain.plugins import sl_ddp

    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    return SupervisedTrainer(config, model=wide_mlp(config.model.width, config.model.depth),
                             source=source.to(device), objective=sl_ddp.masked_mse,
                             device=device)


build_supervised_trainer.config_schema = wide_mlp_schema()


def train_sl(args: argparse.Namespace, compile: bool) -> float:
    width, depth, batch = SIZES[args.size]
    with tempfile.TemporaryDirectory(prefix="overhead_gpu_") as tmp:
        recipe = {
            "factory": "overhead_gpu:build_supervised_trainer", "seed": 0,
            "device": args.device,
            "trainer": {"batch_size": batch, "max_updates": args.updates,
                        "log_every": args.warmup, "validate_every": 0, "save_every": 0,
                        "compile": compile, "output_dir": f"{tmp}/run"},
            "optimizer": {"name": "adam", "lr": 1e-3},
            "model": {"width": width, "depth": depth},
            "data": {"train_size": CORPUS, "val_size": 64, "seed": 1234},
        }
        Path(f"{tmp}/r.yaml").write_text(yaml.safe_dump(recipe))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                        f"{tmp}/r.yaml", "--no-progress"], cwd=REPO, env=env, check=True,
                       capture_output=True)
        elapsed = {r["step"]: r["time/elapsed_s"] for r in map(
            json.loads, Path(f"{tmp}/run/metrics.jsonl").open()) if "time/elapsed_s" in r}
    return (elapsed[args.updates] - elapsed[args.warmup]) / (args.updates - args.warmup)


# -- the hand-written loops -----------------------------------------------------------------


def _setup(args: argparse.Namespace):
    import torch

    from embodichain.plugins import sl_ddp

    torch.manual_seed(0)
    width, depth, batch = SIZES[args.size]
    device = torch.device(args.device)
    model = wide_mlp(width, depth).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    return torch, device, model, optimizer, sl_ddp.make_corpus(CORPUS, 1234), batch


def _train_step(model, optimizer, x, y, mask):
    """The weighted masked MSE (the sum over supervised targets / their count), one step."""
    squared = (model(x) - y).square() * mask
    loss = squared.sum() / mask.sum().clamp_min(1.0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def dataloader_loop(args: argparse.Namespace) -> float:
    """The corpus in host memory, batches from torch's DataLoader, copied to the device."""
    torch, device, model, optimizer, corpus, batch = _setup(args)
    dataset = torch.utils.data.TensorDataset(corpus["x"], corpus["y"], corpus["mask"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                         drop_last=True, pin_memory=device.type == "cuda")
    step, start = 0, None
    while step < args.updates:
        for x, y, mask in loader:
            x, y, mask = (t.to(device, non_blocking=True) for t in (x, y, mask))
            _train_step(model, optimizer, x, y, mask)
            step += 1
            if step == args.warmup:
                start = _synchronized(torch, device)
            if step == args.updates:
                break
    return (_synchronized(torch, device) - start) / (args.updates - args.warmup)


def resident_loop(args: argparse.Namespace) -> float:
    """The corpus on the device; each epoch a permutation drawn there, batches sliced."""
    torch, device, model, optimizer, corpus, batch = _setup(args)
    x, y, mask = (corpus[k].to(device) for k in ("x", "y", "mask"))
    per_epoch = CORPUS // batch
    step, start = 0, None
    while step < args.updates:
        order = torch.randperm(CORPUS, device=device)
        for b in range(per_epoch):
            rows = order[b * batch:(b + 1) * batch]
            _train_step(model, optimizer, x[rows], y[rows], mask[rows])
            step += 1
            if step == args.warmup:
                start = _synchronized(torch, device)
            if step == args.updates:
                break
    return (_synchronized(torch, device) - start) / (args.updates - args.warmup)


def _synchronized(torch, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# -- the comparison -------------------------------------------------------------------------


def run_one(kind: str, args: argparse.Namespace) -> float:
    """One measurement, in a fresh process."""
    if kind.startswith("train-sl"):
        return train_sl(args, compile=kind.endswith("compile"))
    out = subprocess.run([sys.executable, __file__, "--one", kind, "--size", args.size,
                          "--device", args.device, "--updates", str(args.updates),
                          "--warmup", str(args.warmup)],
                         env={**os.environ, "OMP_NUM_THREADS":
                              os.environ.get("OMP_NUM_THREADS", "1")},
                         check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def machine(device: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    if device == "cuda":
        return (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA "
                f"{torch.version.cuda}), {os.cpu_count()} CPUs ({cpu})")
    return f"CPU only ({cpu}, {os.cpu_count()} CPUs), torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--updates", type=int, default=1200)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--one", choices=["dataloader", "resident"], help=argparse.SUPPRESS)
    parser.add_argument("--size", default="small", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.updates % args.warmup:
        parser.error("--updates must be a multiple of --warmup (train-sl logs there)")
    if args.one:
        print((dataloader_loop if args.one == "dataloader" else resident_loop)(args))
        return
    print(machine(args.device))
    results: dict[str, dict[str, list[float]]] = {}
    for size in args.sizes:
        args.size = size
        for round_ in range(args.rounds):
            for kind in args.kinds:
                seconds = run_one(kind, args)
                results.setdefault(size, {}).setdefault(kind, []).append(seconds)
                print(f"{size} round {round_ + 1}: {kind} {seconds * 1e3:.3f} ms/update",
                      file=sys.stderr, flush=True)
    print(f"\nper update, median of {args.rounds} rounds, updates {args.warmup}-{args.updates}, "
          f"Adam, one process, {args.device}:\n")
    print("| model | batch | " + " | ".join(args.kinds) + " | train-sl / resident |")
    print("|---|---:|" + "---:|" * len(args.kinds) + "---:|")
    for size, kinds in results.items():
        width, depth, batch = SIZES[size]
        medians = {k: statistics.median(v) for k, v in kinds.items()}
        ratio = (f"{medians['train-sl'] / medians['resident']:.2f}x"
                 if {"train-sl", "resident"} <= medians.keys() else "-")
        print(f"| MLP width {width}, {depth} layers | {batch} | "
              + " | ".join(f"{medians[k] * 1e3:.3f} ms" for k in args.kinds)
              + f" | {ratio} |")


if __name__ == "__main__":
    main()
