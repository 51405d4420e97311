"""Data-bound training: `train-sl` with `trainer.data_workers: N` against a hand-written loop
over torch's DataLoader(num_workers=N), same examples (compressed 3x128x128 images decoded
and resized per example, benchmarks/data_bound.py), same CNN, batch 64, one process.

Runs alternate (train-sl N workers, hand loop N workers, train-sl 0 workers, ...) so that
machine noise hits all alike; per-update time is the median over 10-update windows after
the first. `--pss` also measures the proportional set size of a trainer with 2 data
workers against the dataset's size (forked workers share the dataset's pages).

    python benchmarks/data_loading.py --rounds 3 --updates 150 --workers 1
    python benchmarks/data_loading.py --pss 256 1024
    python benchmarks/data_loading.py --per-example --count 512
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import BENCH, REPO, bench_env, child_pids, seconds_per_update

ENV = bench_env(BENCH)  # data_bound: the factory


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


def memory_kib(pid: int) -> dict[str, int]:
    """Pss and private (Private_Clean + Private_Dirty) of a process, KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss", "Private_Clean", "Private_Dirty"):
            fields[name] = int(rest.split()[0])
    return {"pss": fields["Pss"], "private": fields["Private_Clean"] + fields["Private_Dirty"]}


def measure_pss(count: int) -> dict[str, float]:
    """PSS of a trainer with 2 data workers, after 30 updates, against the dataset's size."""
    with tempfile.TemporaryDirectory() as work:
        config = recipe(Path(work), 10**6, 2, count)
        size_file = Path(work) / "size"
        proc = subprocess.Popen([sys.executable, "-m", "embodichain", "train-sl", "--config",
                                 str(config), "--no-progress"], cwd=REPO,
                                env={**ENV, "DATA_BOUND_SIZE_FILE": str(size_file)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        metrics = Path(work) / "run" / "metrics.jsonl"
        try:
            while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
                if proc.poll() is not None:
                    sys.exit(f"the run ended ({proc.returncode}) before it was measured")
                time.sleep(0.5)
            procs = [proc.pid, *child_pids(proc.pid)]
            memory = [memory_kib(p) for p in procs]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
        dataset = int(size_file.read_text()) / 2**20
    mib = [{k: v / 1024 for k, v in m.items()} for m in memory]
    total = sum(m["pss"] for m in mib)
    pss = ", ".join(f"{m['pss']:.1f}" for m in mib[1:])
    private = ", ".join(f"{m['private']:.1f}" for m in mib[1:])
    print(f"dataset {dataset:.1f} MiB: PSS trainer {mib[0]['pss']:.1f} MiB, data workers "
          f"{pss} MiB (private {private} MiB); total {total:.1f} MiB", flush=True)
    return {"dataset": dataset, "total": total,
            "worker_private": max(m["private"] for m in mib[1:])}


def measure_pss_slope(counts: list[int]) -> None:
    """Total PSS at two dataset sizes: its growth per MiB of dataset is 1 when the workers
    share the dataset's pages, 3 when each of the 3 processes holds a copy."""
    small, large = (measure_pss(c) for c in counts)
    grown = large["dataset"] - small["dataset"]
    slope = (large["total"] - small["total"]) / grown
    private = (large["worker_private"] - small["worker_private"]) / grown
    print(f"per MiB of dataset: total PSS grows {slope:.2f} MiB (it counts what the trainer "
          f"built the dataset with, inherited too); each worker's private memory "
          f"{private:.2f} MiB (1 would be a copy each)")


def per_example(count: int, repeats: int = 15) -> None:
    """CPU time per example (time.process_time, robust to a loaded machine): the dataset's
    own `__getitem__` against the framework's seeded loading of it, in a worker (seeding
    only) and in the training process (seeding, then restoring the training streams)."""
    import torch
    from data_bound import CompressedImages, make_blob

    from embodichain.core.data.loader import SeededExamples

    dataset = CompressedImages(*make_blob(count, 0))
    seeded = SeededExamples(dataset, 0, 0)
    in_worker = torch.utils.data._utils.worker  # get_worker_info() reads its _worker_info

    def raw() -> None:
        for i in range(count):
            dataset[i]

    def framework() -> None:  # as the DataLoader's fetcher calls it: a batch at a time
        for first in range(0, count, 64):
            seeded.__getitems__([(i, i // 64, i % 64) for i in range(first, first + 64)])

    def framework_in_worker() -> None:
        in_worker._worker_info = object()  # as inside a DataLoader worker
        try:
            framework()
        finally:
            in_worker._worker_info = None

    times: dict[str, list[float]] = {"dataset[i]": [], "seeded, in a worker": [],
                                     "seeded + restored, in process": []}
    runs = [("dataset[i]", raw), ("seeded, in a worker", framework_in_worker),
            ("seeded + restored, in process", framework)]
    for r in range(repeats):
        for name, run in runs[r % 3:] + runs[:r % 3]:  # each order alike
            start = time.process_time()
            run()
            times[name].append((time.process_time() - start) / count)
    base = statistics.median(times["dataset[i]"])
    for name, values in times.items():
        us = statistics.median(values) * 1e6
        print(f"  {name:<31} {us:8.1f} us/example  {us / (base * 1e6):.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=150)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--count", type=int, default=2048)
    parser.add_argument("--pss", type=int, nargs=2, metavar=("SMALL", "LARGE"),
                        help="measure PSS with datasets of SMALL and LARGE images")
    parser.add_argument("--per-example", action="store_true",
                        help="CPU time per example: the dataset alone vs seeded loading")
    parser.add_argument("--hand-loop", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hand_loop is not None:
        return hand_loop(args.hand_loop, args.updates, args.workers, args.count)
    if args.pss:
        return measure_pss_slope(args.pss)
    if args.per_example:
        return per_example(args.count)
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
