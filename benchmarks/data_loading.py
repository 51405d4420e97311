"""Data-bound training: `train-sl` with `trainer.data_workers: N` against a hand-written loop
over torch's DataLoader(num_workers=N), same examples (compressed 3x128x128 images decoded
and resized per example, benchmarks/data_bound.py), same CNN, batch 64, one process.

Runs alternate (train-sl N workers, hand loop N workers, train-sl 0 workers, ...) so that
machine noise hits all alike; per-update time is the median over 10-update windows after
the first. `--pss` also measures the proportional set size of a trainer with 2 data
workers against the dataset's size (forked workers share the dataset's pages).

    python benchmarks/data_loading.py --rounds 3 --updates 150 --workers 1
    python benchmarks/data_loading.py --pss
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(BENCH)}


def seconds_per_update(metrics: Path) -> float:
    points = [(r["step"], r["time/elapsed_s"]) for r in map(json.loads, metrics.open())
              if "time/elapsed_s" in r]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(points, points[1:],
                                                                  strict=False)]
    return statistics.median(rates)


def recipe(work: Path, updates: int, workers: int, count: int) -> Path:
    data = {"factory": "data_bound:build_supervised_trainer", "seed": 0, "device": "cpu",
            "trainer": {"batch_size": 64, "max_updates": updates, "log_every": 10,
                        "data_workers": workers, "output_dir": str(work / "run")},
            "optimizer": {"name": "adam", "lr": 0.001}, "data": {"count": count}}
    (work / "r.yaml").write_text(yaml.safe_dump(data))
    return work / "r.yaml"


def framework(work: Path, updates: int, workers: int, count: int) -> float:
    subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config",
                    str(recipe(work, updates, workers, count)), "--no-progress"], cwd=REPO,
                   env=ENV, check=True, stdout=subprocess.DEVNULL)
    return seconds_per_update(work / "run" / "metrics.jsonl")


def hand(work: Path, updates: int, workers: int, count: int) -> float:
    subprocess.run([sys.executable, __file__, "--hand-loop", str(work), "--updates",
                    str(updates), "--workers", str(workers), "--count", str(count)],
                   cwd=REPO, env=ENV, check=True)
    return seconds_per_update(work / "metrics.jsonl")


def hand_loop(out: Path, updates: int, workers: int, count: int) -> None:
    """What a user writes without the framework: DataLoader, model, Adam, loop."""
    import torch
    from data_bound import CompressedImages, make_blob, make_model
    from torch.utils.data import DataLoader, RandomSampler

    torch.manual_seed(0)
    dataset = CompressedImages(*make_blob(count, 0))
    sampler = RandomSampler(dataset, replacement=True, num_samples=updates * 64,
                            generator=torch.Generator().manual_seed(0))
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=workers,
                        prefetch_factor=2 if workers else None)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    start = time.perf_counter()
    with (out / "metrics.jsonl").open("w") as log:
        for step, batch in enumerate(loader, start=1):
            loss = (model(batch["image"]) - batch["target"]).square().mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                log.write(json.dumps({"step": step, "train/loss": loss.item(),
                                      "time/elapsed_s": time.perf_counter() - start}) + "\n")


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Pss for {pid}")


def children(pid: int) -> list[int]:
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


def measure_pss(count: int) -> None:
    sys.path.insert(0, str(BENCH))
    from data_bound import make_blob

    blob, offsets, target = make_blob(count, 0)
    dataset_mib = (blob.numel() + offsets.numel() * 8 + target.numel() * 4) / 2**20
    with tempfile.TemporaryDirectory() as work:
        config = recipe(Path(work), 10**6, 2, count)
        proc = subprocess.Popen([sys.executable, "-m", "embodichain", "train-sl", "--config",
                                 str(config), "--no-progress"], cwd=REPO, env=ENV,
                                stdout=subprocess.DEVNULL)
        metrics = Path(work) / "run" / "metrics.jsonl"
        try:
            while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
                time.sleep(0.5)
            workers = children(proc.pid)
            trainer = pss_kib(proc.pid) / 1024
            each = [pss_kib(p) / 1024 for p in workers]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
    print(f"dataset {dataset_mib:.1f} MiB (compressed images in one buffer); PSS trainer "
          f"{trainer:.1f} MiB, {len(each)} data workers "
          f"{', '.join(f'{p:.1f}' for p in each)} MiB; total {trainer + sum(each):.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=150)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--count", type=int, default=2048)
    parser.add_argument("--pss", action="store_true")
    parser.add_argument("--hand-loop", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_loop is not None:
        return hand_loop(args.hand_loop, args.updates, args.workers, args.count)
    if args.pss:
        return measure_pss(args.count)
    n = args.workers
    rows: dict[str, list[float]] = {f"train-sl data_workers {n}": [],
                                    f"hand loop num_workers {n}": [],
                                    "train-sl data_workers 0": []}
    for r in range(args.rounds):
        for name, run, workers in ((f"train-sl data_workers {n}", framework, n),
                                   (f"hand loop num_workers {n}", hand, n),
                                   ("train-sl data_workers 0", framework, 0)):
            with tempfile.TemporaryDirectory() as work:
                rows[name].append(run(Path(work), args.updates, workers, args.count))
            print(f"round {r + 1}: {name}: {rows[name][-1] * 1e3:.1f} ms/update", flush=True)
    hand_ms = statistics.median(rows[f"hand loop num_workers {n}"])
    print("\nmedian ms per update (ratio to the hand loop):")
    for name, values in rows.items():
        ms = statistics.median(values)
        print(f"  {name:<28} {ms * 1e3:7.1f} ms  {ms / hand_ms:.3f}x")


if __name__ == "__main__":
    main()
