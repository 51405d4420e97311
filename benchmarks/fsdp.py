"""`trainer.strategy: fsdp` against `ddp`, side by side in one run (design §13, R-SHARD-1/2).

A 4 -> 4096 x 6 -> 2 MLP (about 100 M parameters) with Adam trains with 2 CPU workers under
torchrun (gloo), through the real `train-sl` CLI, once per strategy and save mode, saving
every `--save-every` updates. Each worker records, per rank:

- the training state it holds: parameters and optimizer state (its local shards under
  fsdp), counted from the tensors after training (gradients are freed between updates, and
  would add one more parameter-sized amount each);
- its peak RSS (the process's high-water mark: torch itself, the state, the gradients, the
  all-gather / reduce-scatter buffers, the save's CPU copy);
- the median time per update;
- the pause of a save in the training loop, median over the saves but the last: with
  `async_save: true` the copy of the state into CPU memory (ddp: every rank's own state is
  gathered, rank 0 copies the whole model and optimizer; fsdp: each rank its shard); with
  `async_save: false` the whole write (digest, serialisation, fsync, renames), which is the
  write time of the save.

    python benchmarks/fsdp.py --updates 12 --save-every 4
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
WIDTH, DEPTH = 4096, 6
STATS_ENV = "EMBODICHAIN_BENCH_STATS"


def build_supervised_trainer(config, device):
    """The benchmark's factory: the MLP, its layers named as shard blocks, timed."""
    import atexit

    from torch import nn

    from embodichain.core.distributed.sharding import local
    from embodichain.learning.sl import SupervisedTrainer, TensorSource
    from embodichain.plugins import sl_ddp

    width = config.model.width
    model = wide_mlp(width, config.model.depth)
    blocks = [m for m in model if isinstance(m, nn.Linear) and m.in_features == width
              and m.out_features == width]
    parameters = sum(p.numel() for p in model.parameters())
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    trainer = SupervisedTrainer(config, model=model, source=source,
                                objective=sl_ddp.masked_mse, device=device,
                                shard_blocks=blocks)
    stats = {"update_s": [], "save_s": [], "parameters": parameters}
    update, save = trainer.learner.update, trainer.save

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

    def dump():
        learner = trainer.learner
        held = sum(local(p).numel() * local(p).element_size()
                   for p in learner.model.parameters())
        held += sum(local(t).numel() * local(t).element_size()
                    for s in learner.optimizer.state.values() for t in s.values()
                    if hasattr(t, "numel"))
        stats["state_bytes"] = held
        stats["staged_bytes"] = trainer.checkpoints.writer.staged_bytes
        stats["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rank = os.environ.get("RANK", "0")
        Path(f"{os.environ[STATS_ENV]}.rank{rank}").write_text(json.dumps(stats))

    trainer.learner.update, trainer.save = timed_update, timed_save
    atexit.register(dump)
    return trainer


build_supervised_trainer.config_schema = wide_mlp_schema()


def run_one(strategy: str, async_save: bool, updates: int, save_every: int, root: Path
            ) -> list[dict]:
    name = f"{strategy}_{'async' if async_save else 'sync'}"
    recipe = {
        "factory": "fsdp:build_supervised_trainer", "seed": 0, "device": "cpu",
        "trainer": {"batch_size": 8, "max_updates": updates, "save_every": save_every,
                    "log_every": 100, "keep_last": 1, "async_save": async_save,
                    "strategy": strategy, "output_dir": str(root / name)},
        "optimizer": {"name": "adam", "lr": 1e-4},
        "model": {"width": WIDTH, "depth": DEPTH},
        "data": {"train_size": 4096, "val_size": 64, "seed": 1234},
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    stats_file = root / f"{name}.json"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           STATS_ENV: str(stats_file),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nnodes=1", "--nproc-per-node=2", "-m", "embodichain", "train-sl",
                    "--config", str(path), "--no-progress"], cwd=REPO, env=env, check=True,
                   capture_output=True)
    rows = []
    for rank in range(2):
        stats = json.loads(Path(f"{stats_file}.rank{rank}").read_text())
        pauses = stats["save_s"][:-1] if len(stats["save_s"]) > 1 else stats["save_s"]
        rows.append({"strategy": strategy, "async": async_save, "rank": rank,
                     "parameters": stats["parameters"],
                     "update_s": statistics.median(stats["update_s"]),
                     "pause_s": statistics.median(pauses),
                     "state_mb": stats["state_bytes"] / 1e6,
                     "staged_mb": stats["staged_bytes"] / 1e6,
                     "maxrss_mb": stats["maxrss_mb"]})
    for ckpt in (root / name).rglob("*.pt"):  # keep the disk free for the next run
        ckpt.unlink()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fsdp_bench_") as tmp:
        for async_save in (True, False):
            for strategy in ("ddp", "fsdp"):
                rows += run_one(strategy, async_save, args.updates, args.save_every,
                                Path(tmp))
                print(json.dumps(rows[-2:]), file=sys.stderr, flush=True)
    print(f"{rows[0]['parameters'] / 1e6:.1f} M parameters, Adam, 2 CPU workers (gloo)\n")
    print("| strategy | save mode | rank | state held | peak RSS | update (median) "
          "| save pause (median) | staged copy |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['strategy']} | {'async' if r['async'] else 'sync (= write time)'} "
              f"| {r['rank']} | {r['state_mb']:.0f} MB | {r['maxrss_mb']:.0f} MB "
              f"| {r['update_s'] * 1e3:.0f} ms | {r['pause_s'] * 1e3:.0f} ms "
              f"| {r['staged_mb']:.0f} MB |")
    by = {(r["strategy"], r["async"], r["rank"]): r for r in rows}
    print()
    for key, what in (("state_mb", "state held per rank"), ("maxrss_mb", "peak RSS per rank"),
                      ("update_s", "time per update")):
        ratios = [by[("fsdp", True, k)][key] / by[("ddp", True, k)][key] for k in range(2)]
        print(f"fsdp / ddp, {what}: rank 0 {ratios[0]:.2f}x, rank 1 {ratios[1]:.2f}x")
    for mode, what in ((True, "save pause (async)"), (False, "write time (sync save)")):
        ratio = by[("fsdp", mode, 0)]["pause_s"] / by[("ddp", mode, 0)]["pause_s"]
        print(f"fsdp / ddp, {what} on rank 0: {ratio:.2f}x")


if __name__ == "__main__":
    main()
