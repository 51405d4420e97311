"""torchrun worker for tests/core/distributed/test_sharding.py: the sharding and sharded-
checkpoint modules on their own, without the trainer.

    torchrun --nproc-per-node=2 sharded_modules.py OUT_DIR

Trains a small MLP (uneven dim-0 sizes: 33 rows over 2 ranks) 20 Adam updates twice: sharded
with FSDP2 and replicated with a hand-written weighted all-reduce (the DDP arithmetic); rank r
weighs its loss by r + 1 and rank 1 has zero weight every third update. Then saves the sharded
state (a ShardSave job on a background CheckpointWriter), restores it into a fresh sharded
model, and writes OUT_DIR/result_RANK.pt for the test to compare.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from embodichain.core.checkpoint.sharded import restore_shard, shard_relpath, shard_state
from embodichain.core.checkpoint.sharded_writer import ShardSave, release_save_group, save_group
from embodichain.core.checkpoint.writer import CheckpointWriter
from embodichain.core.distributed.sharding import divide_gradients, local, shard_model


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 33), nn.Tanh(), nn.Linear(33, 2))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
    weight = 0.0 if rank == 1 and step % 3 == 0 else float(rank + 1)
    return x, y, weight


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, sharded: bool
          ) -> None:
    rank = dist.get_rank()
    for step in steps:
        x, y, w = batch(step, rank)
        loss = (model(x) - y).square().mean() * w
        loss.backward()
        weight = torch.tensor([w])
        dist.all_reduce(weight)
        if sharded:
            divide_gradients(model.parameters(), weight)
        else:
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(weight.clamp_min(torch.finfo(torch.float32).tiny))
        if weight.item() > 0:
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    plain = make_model()
    plain_opt = torch.optim.Adam(plain.parameters(), lr=0.01)
    train(plain, plain_opt, range(20), sharded=False)

    model = shard_model(make_model(), device, blocks=[])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    train(model, optimizer, range(10), sharded=True)
    writer, group = CheckpointWriter(background=True), save_group()
    run = {"step": 10, "run_id": "r", "world_size": 2, "config_sha256": "c"}
    state = shard_state(model, optimizer, None, {"rng": torch.get_rng_state()})
    manifest = {"run": run} if rank == 0 else None
    writer.write(ShardSave(out, shard_relpath(10, "tok", rank), run, state, manifest,
                           out / "last.pt", group=group))
    train(model, optimizer, range(10, 20), sharded=True)  # while the save runs
    failure = writer.settle()
    assert failure is None, failure
    sharded_full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    after_20 = {k: local(v).clone() for k, v in model.state_dict().items()}

    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.sharded import read_shard

    data = read_checkpoint(out / "last.pt")
    fresh = shard_model(make_model(), device)
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.01)
    restore_shard(fresh, fresh_opt, read_shard(out, data, rank)["payload"])
    train(fresh, fresh_opt, range(10, 20), sharded=True)
    resumed = {k: local(v).clone() for k, v in fresh.state_dict().items()}
    writer.settle()
    release_save_group(group)
    torch.save({"plain": plain.state_dict(), "sharded_full": sharded_full,
                "after_20": after_20, "resumed": resumed}, out / f"result_{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
