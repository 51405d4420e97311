"""torchrun worker for tests/core/distributed/test_recut.py: sharded checkpoints re-cut for
another world size through `FsdpStrategy` (save job, receive, restore), without the trainer.

    torchrun --nproc-per-node=N recut_shards.py --out OUT [--restore CKPT ...] [--save DIR]

Builds a small model whose dim-0 sizes are uneven over 2 ranks (5 rows: 3 + 2; 1 row: 1 + an
empty chunk) with a BatchNorm (per-rank buffers), Adam and a sharded EMA. Each `--restore`
checkpoint is restored in this world (a refusal is recorded as its message) and what this
rank then holds goes to OUT/result_RANK.pt; then, with `--save`, it trains 3 updates and saves
a sharded checkpoint into DIR with the strategy's save job, and rank 0 writes the full
tensors (DIR/reference.pt) for the test to cut its expectations from.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import payload_to_restore
from embodichain.core.distributed.sharding import dim0_cut, local
from embodichain.core.errors import CheckpointError
from embodichain.core.training.strategies.base import Snapshot
from embodichain.core.training.strategies.fsdp import FsdpStrategy


def make_learner(strategy: FsdpStrategy) -> SimpleNamespace:
    torch.manual_seed(100 + dist.get_world_size())  # unlike any saved state
    model = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, 1))
    strategy.prepare(model, None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return SimpleNamespace(model=model, optimizer=optimizer, scheduler=scheduler,
                           scaler=torch.amp.GradScaler("cpu", enabled=False),
                           ema=strategy.make_ema(model, 0.5))


def train(learner: SimpleNamespace, updates: int) -> None:
    rank = dist.get_rank()
    for step in range(updates):
        g = torch.Generator().manual_seed(1000 * step + rank)
        loss = learner.model(torch.randn(8, 3, generator=g) * (rank + 1)).square().mean()
        loss.backward()
        learner.optimizer.step()
        learner.optimizer.zero_grad(set_to_none=True)
        learner.scheduler.step()
        learner.ema.update()


def held(learner: SimpleNamespace, rank_state: dict) -> dict:
    """What this rank holds: its local shards and where they lie."""
    model = learner.model.state_dict()
    return {
        "model": {k: local(v).clone() for k, v in model.items()},
        "cuts": {k: dim0_cut(v) for k, v in model.items() if hasattr(v, "device_mesh")},
        "optimizer": {i: {k: local(v).clone() for k, v in e.items()}
                      for i, e in learner.optimizer.state_dict()["state"].items()},
        "ema": {k: v.clone() for k, v in learner.ema.state_dict().items()},
        "scheduler": learner.scheduler.state_dict()["last_epoch"],
        "rank_state": rank_state,
    }


def restore(strategy: FsdpStrategy, learner: SimpleNamespace, path: Path) -> dict:
    payload = None
    if dist.get_rank() == 0:
        payload = payload_to_restore(read_checkpoint(path), path)
    try:
        common = strategy.receive(payload)
        return held(learner, dict(strategy.restore(learner, common)))
    except CheckpointError as exc:
        return {"error": str(exc)}


def save(strategy: FsdpStrategy, learner: SimpleNamespace, directory: Path) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    directory.mkdir(parents=True, exist_ok=True)
    run = {"step": 3, "run_id": f"r{world}", "world_size": world, "config_sha256": "c"}
    own = {"rank": rank, "marker": torch.tensor([float(rank)]), "rng": torch.get_rng_state()}
    snapshot = Snapshot(step=3, path=directory / "step_3.pt", directory=directory,
                        identity=run, own=own,
                        payload={"run": run, "callbacks": {}} if rank == 0 else None,
                        also_as=directory / "last.pt")
    failure = strategy.save_job(learner, snapshot).run()
    assert failure is None, failure
    full = {"model": {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone()
                      for k, v in learner.model.state_dict().items()},
            "optimizer": {i: {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone()
                              for k, v in e.items()}
                          for i, e in learner.optimizer.state_dict()["state"].items()},
            "scheduler": learner.scheduler.state_dict()["last_epoch"]}
    if rank == 0:
        torch.save(full, directory / "reference.pt")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--restore", type=Path, nargs="*", default=[])
    parser.add_argument("--save", type=Path)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    strategy = FsdpStrategy(torch.device("cpu"), "fp32")
    # Whether a world-size change is allowed is the resume policy's (check_format, the
    # trainer): this worker tests the re-cut itself, so it lets every checkpoint through.
    strategy.check_format = lambda payload: None
    learner = make_learner(strategy)
    results = {str(path): restore(strategy, learner, path) for path in args.restore}
    torch.save(results, args.out / f"result_{dist.get_rank()}.pt")
    if args.save is not None:
        train(learner, 3)
        save(strategy, learner, args.save)
    strategy.release()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
