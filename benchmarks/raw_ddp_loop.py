"""The sl_ddp recipe as a hand-written DDP loop: the baseline `overhead.py` compares against.

Same corpus, model, batch size, optimizer and schedule as `examples/learning/sl_ddp/cpu.yaml`;
validation every 50 updates on rank 0; rank 0 saves model + optimizer at 100 and 200. The
weighted update needs the global weight before backward, so this loop all-reduces
`[weight, weight * loss]` first and then lets DDP all-reduce the gradients: two collectives
per update, the usual way to write it by hand.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 benchmarks/raw_ddp_loop.py \
        --out /tmp/raw --max-updates 200
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


# The corpus and model of embodichain/plugins/sl_ddp.py, restated so that this baseline
# imports nothing from embodichain (it would otherwise pay the framework's imports).
def make_corpus(size: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=g)
    noise = 0.05 * torch.randn(size, 2, generator=g)
    y0 = x @ torch.tensor([0.5, -1.0, 0.25, 2.0]) + 0.1
    y1 = x @ torch.tensor([1.0, 0.5, -0.5, 0.0]) + torch.sin(2.0 * x[:, 1])
    mask = torch.stack([torch.ones(size), (x[:, 0] > 0).float()], dim=1)
    return {"x": x, "y": torch.stack([y0, y1], dim=1) + noise, "mask": mask}


def validation_seed(seed: int) -> int:
    digest = hashlib.sha256(f"sl_ddp-validation:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-updates", type=int, default=200)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train = make_corpus(4096, 1234)
    val = make_corpus(1024, validation_seed(1234))
    model = make_model(32)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = torch.Generator().manual_seed(1000 + rank)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        log = open(args.out / "metrics.jsonl", "w")  # noqa: SIM115
    start = time.perf_counter()

    for step in range(1, args.max_updates + 1):
        idx = torch.randint(len(train["x"]), (32,), generator=sampler)
        x, y, mask = train["x"][idx], train["y"][idx], train["mask"][idx]
        squared = (ddp(x) - y).square() * mask
        weight = mask.sum()
        loss = squared.sum() / weight.clamp_min(1.0)
        totals = torch.stack([weight, weight * loss.detach()])
        dist.all_reduce(totals)  # collective 1: global weight (and the loss to log)
        # DDP averages gradients over ranks; scale so the average is the weighted mean.
        (loss * weight * world / totals[0]).backward()  # collective 2: gradients
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if rank == 0 and step % 10 == 0:
            record = {"step": step, "train/loss": (totals[1] / totals[0]).item(),
                      "time/elapsed_s": time.perf_counter() - start}
            log.write(json.dumps(record) + "\n")
            log.flush()
        if rank == 0 and step % 50 == 0:
            model.eval()
            with torch.no_grad():
                mse = ((model(val["x"]) - val["y"]).square() * val["mask"]).sum() \
                    / val["mask"].sum()
            model.train()
            log.write(json.dumps({"step": step, "validation/mse": mse.item()}) + "\n")
        if rank == 0 and step % 100 == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state, args.out / f"step_{step}.pt")

    if rank == 0:
        log.close()
    del ddp  # a DDP object alive at exit can abort torch (see core/distributed/process_group.py)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
