"""Resuming a sharded (`trainer.strategy: fsdp`) checkpoint on another world size: the re-cut
against a same-size resume (R-ELASTIC-3, the FSDP side).

The ~100 M-parameter MLP of benchmarks/fsdp.py (4 -> 4096 x 6 -> 2, the six 4096 x 4096
layers as shard blocks) with Adam (its moments made by one step on zero gradients) and a
sharded EMA is saved by `FsdpStrategy`'s save job on 2 workers (A) and on 1 (B), each a
torchrun of gloo CPU workers; then each checkpoint is restored by `FsdpStrategy.restore` in
a fresh torchrun at the same size (A on 2, B on 1) and re-cut (A on 1, B on 2). Each worker
records, around the restore alone (the manifest read on rank 0, its broadcast, the checks,
the load):

- the wall time (from a barrier to the end of the restore);
- its RSS before and its peak RSS during the restore (the high-water mark reset just before,
  `/proc/self/clear_refs`; it counts the mapped pages of old shards that it touched);
- its own share (its local parameters, optimizer state and EMA) and the largest old shard
  file. The bound of a re-cut: growth during the restore <= the state it allocates (the
  optimizer's share) + one old shard's file.

The shard files were just written, so they are in the page cache for every variant alike.
Whether a world-size change is allowed is the resume policy's (the trainer's check), not
the strategy's: the workers here let it through, to time the re-cut itself.

    python benchmarks/fsdp_recut.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import wide_mlp

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WIDTH, DEPTH = 4096, 6
MB = 1 << 20


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _learner(strategy):
    from types import SimpleNamespace

    import torch
    from torch import nn

    from embodichain.core.training.strategies import SpreadOptions

    torch.manual_seed(0)
    model = wide_mlp(WIDTH, DEPTH)
    blocks = [m for m in model if isinstance(m, nn.Linear) and m.in_features == WIDTH]
    strategy.options = SpreadOptions(tuple(blocks))  # the factory's blocks, as a learner gives
    strategy.prepare(model, None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler,
                           scaler=torch.amp.GradScaler("cpu", enabled=False),
                           ema=strategy.make_ema(model, 0.999))


def _share(learner) -> int:
    from embodichain.core.checkpoint.sharded import local

    tensors = [local(p) for p in learner.model.parameters()]
    tensors += [local(v) for s in learner.optimizer.state.values() for v in s.values()]
    tensors += list(learner.ema.state_dict().values())
    return sum(t.numel() * t.element_size() for t in tensors)


def worker(mode: str, directory: Path, out: Path) -> None:
    import torch
    import torch.distributed as dist

    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.sharded import payload_to_restore
    from embodichain.core.training.strategies.base import Snapshot
    from embodichain.core.training.strategies.fsdp import FsdpStrategy

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    strategy = FsdpStrategy(torch.device("cpu"), "fp32")
    strategy.check_format = lambda payload: None  # the policy's check, not timed here
    learner = _learner(strategy)
    record: dict = {"rank": rank, "world": world}
    if mode == "save":
        for p in learner.model.parameters():
            p.grad = torch.zeros_like(p)
        learner.optimizer.step()
        learner.ema.update()
        run = {"step": 1, "run_id": f"w{world}", "world_size": world, "config_sha256": "c"}
        snapshot = Snapshot(step=1, path=directory / "step_1.pt", directory=directory,
                            identity=run, own={"rank": rank},
                            payload={"run": run, "callbacks": {}} if rank == 0 else None,
                            also_as=directory / "last.pt")
        start = time.perf_counter()
        failure = strategy.save_job(learner, snapshot).run()
        assert failure is None, failure
        record["save_s"] = time.perf_counter() - start
    else:
        path = directory / "last.pt"
        dist.barrier()
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS
        before = _status("VmRSS")
        start = time.perf_counter()
        payload = payload_to_restore(read_checkpoint(path), path) if rank == 0 else None
        strategy.restore(learner, strategy.receive(payload))
        record["restore_s"] = time.perf_counter() - start
        record |= {"rss_before": before, "peak": _status("VmHWM"), "share": _share(learner),
                   "old_shard": max(e["bytes"] for e in
                                    read_checkpoint(path)["payload"]["sharded"]["shards"]
                                    .values())}
    (out / f"{mode}_{rank}.json").write_text(json.dumps(record))
    strategy.release()
    dist.destroy_process_group()


def launch(nproc: int, mode: str, directory: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nnodes=1", f"--nproc-per-node={nproc}", str(Path(__file__).resolve()),
                    "--worker", mode, "--dir", str(directory), "--out", str(out)],
                   check=True, env=env, cwd=REPO)
    return [json.loads((out / f"{mode}_{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["save", "restore"])
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.dir, args.out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for saved in (2, 1):
            (root / f"w{saved}").mkdir()
            launch(saved, "save", root / f"w{saved}", root / f"out_save{saved}")
        print("| checkpoint of | restored on | kind | rank | restore | RSS before | peak RSS "
              "| growth | own share | largest old shard |")
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for saved, now in ((2, 2), (2, 1), (1, 1), (1, 2)):
            kind = "same size" if saved == now else "re-cut"
            for r in launch(now, "restore", root / f"w{saved}", root / f"out_{saved}_{now}"):
                print(f"| {saved} | {now} | {kind} | {r['rank']} | {r['restore_s']:.2f} s "
                      f"| {r['rss_before'] / MB:.0f} MB | {r['peak'] / MB:.0f} MB "
                      f"| {(r['peak'] - r['rss_before']) / MB:.0f} MB | {r['share'] / MB:.0f} MB "
                      f"| {r['old_shard'] / MB:.0f} MB |", flush=True)


if __name__ == "__main__":
    main()
