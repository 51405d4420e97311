"""The pause per checkpoint save, `trainer.async_save: true` against `false` (R-CKPT-8).

Each configuration trains an MLP of about 1M, 12M or 50M parameters with Adam (one process,
the real `train-sl` CLI, the sl_ddp corpus), saving every `--save-every` updates, in its own
subprocess (so that its peak memory is its own); the two modes alternate per size. Reported:

- pause: the time the training loop spends in `trainer.save` (a synchronous save: digest,
  serialisation, fsync, renames; a background one: waiting for the previous write, the copy
  into CPU memory, the hand-over), median over the saves, and in update-equivalents (the
  median update time of the same run);
- cost per save: (the fit's wall time - updates x median update) / saves, which also counts
  what the background thread takes from the updates while it runs (CPU, memory bandwidth);
- the extra peak memory: the reused CPU copy (staged bytes), and each run's peak RSS.

    python benchmarks/async_save.py --sizes 1m 12m 50m --updates 60 --save-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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
SIZES = {"1m": (512, 4), "12m": (2048, 3), "50m": (2048, 12)}  # (width, hidden layers)
STATS_ENV = "EMBODICHAIN_BENCH_STATS"


# -- the factory, run inside each `train-sl` subprocess -------------------------------------------

def build_supervised_trainer(config, device):
    import atexit

    from embodichain.learning.sl import SupervisedTrainer, TensorSource
    from embodichain.plugins import sl_ddp

    model = wide_mlp(config.model.width, config.model.depth)
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    trainer = SupervisedTrainer(config, model=model, source=source,
                                objective=sl_ddp.masked_mse, device=device)
    stats = {"update_s": [], "save_s": [], "fit_s": None,
             "parameters": sum(p.numel() for p in model.parameters())}
    update, save, fit = trainer.learner.update, trainer.save, trainer.fit

    def timed_update(*args, **kwargs):
        start = time.perf_counter()
        try:
            return update(*args, **kwargs)
        finally:
            stats["update_s"].append(time.perf_counter() - start)

    def timed_save(path):
        start = time.perf_counter()
        try:
            return save(path)
        finally:
            stats["save_s"].append(time.perf_counter() - start)

    def timed_fit(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fit(*args, **kwargs)
        finally:
            stats["fit_s"] = time.perf_counter() - start

    def dump():
        writer = trainer.checkpoints.writer
        stats["staged_bytes"] = writer.staged_bytes if writer is not None else 0
        stats["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        Path(os.environ[STATS_ENV]).write_text(json.dumps(stats))

    trainer.learner.update, trainer.save, trainer.fit = timed_update, timed_save, timed_fit
    atexit.register(dump)
    return trainer


build_supervised_trainer.config_schema = wide_mlp_schema()


# -- the harness ----------------------------------------------------------------------------------

def run_one(size: str, async_save: bool, updates: int, save_every: int, root: Path) -> dict:
    width, depth = SIZES[size]
    name = f"{size}_{'async' if async_save else 'sync'}"
    recipe = {
        "factory": "async_save:build_supervised_trainer", "seed": 0, "device": "cpu",
        "trainer": {"batch_size": 16, "max_updates": updates, "save_every": save_every,
                    "log_every": 10, "keep_last": 1, "async_save": async_save,
                    "output_dir": str(root / name)},
        "optimizer": {"name": "adam", "lr": 1e-4},
        "model": {"width": width, "depth": depth},
        "data": {"train_size": 4096, "val_size": 64, "seed": 1234},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    stats_file = root / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           STATS_ENV: str(stats_file),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "embodichain", "train-sl", "--config", str(path),
                    "--no-progress"], cwd=REPO, env=env, check=True, capture_output=True)
    stats = json.loads(stats_file.read_text())
    for ckpt in (root / name).glob("*.pt"):  # keep the disk free for the next run
        ckpt.unlink()
    update = statistics.median(stats["update_s"])
    # the final save at the end is the same in both modes (waited for): leave it out
    pauses = stats["save_s"][:-1] if len(stats["save_s"]) > 1 else stats["save_s"]
    saves = len(stats["save_s"])
    return {"size": size, "async": async_save, "parameters": stats["parameters"],
            "update_s": update, "pause_s": statistics.median(pauses),
            "pause_updates": statistics.median(pauses) / update,
            "cost_per_save_s": (stats["fit_s"] - len(stats["update_s"]) * update) / saves,
            "staged_mb": stats["staged_bytes"] / 1e6, "maxrss_mb": stats["maxrss_mb"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--updates", type=int, default=60)
    parser.add_argument("--save-every", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="async_save_bench_") as tmp:
        for size in args.sizes:
            for mode in (False, True):
                rows.append(run_one(size, mode, args.updates, args.save_every, Path(tmp)))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| params | mode | update (median) | pause per save | in updates | cost per save "
          "| async/sync pause | staged copy | peak RSS |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    sync = {r["size"]: r for r in rows if not r["async"]}
    for r in rows:
        ratio = (f"{sync[r['size']]['pause_s'] / r['pause_s']:.0f}x less" if r["async"]
                 and r["size"] in sync else "")
        print(f"| {r['parameters'] / 1e6:.1f}M | {'async' if r['async'] else 'sync'} "
              f"| {r['update_s'] * 1e3:.0f} ms | {r['pause_s'] * 1e3:.0f} ms "
              f"| {r['pause_updates']:.2f} | {r['cost_per_save_s'] * 1e3:.0f} ms | {ratio} "
              f"| {r['staged_mb']:.0f} MB | {r['maxrss_mb']:.0f} MB |")


if __name__ == "__main__":
    main()
