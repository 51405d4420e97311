"""Accumulated updates through the real Learner (R-LOOP-1), for tests/core/training/
test_grad_accumulation.py.

    torchrun --nproc-per-node=2 -m accumulated_update OUT

Each rank draws K * B indices per update from its own ReplacementSampler stream and cuts
them into K micro-batches (MicroBatches), as the trainer does, and trains UPDATES SGD
updates with grad_accumulation K. The ranks' masks are uneven (rank 1 supervises only
target 0), rank 0's micro-batch 1 of update 1 has zero weight, and update 2 has zero weight
on every rank (it must skip). `torch.distributed.all_reduce` is counted per update, for this
learner and for a K = 1 learner of the same model (whose count is the number of gradient
buckets). Every rank writes `OUT/rank{R}.pt`: the micro-batches as the objective saw them,
the parameters before each update and after the last, the summaries and the counts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from embodichain.core.data.micro_batches import MicroBatches
from embodichain.core.data.samplers import ReplacementSampler
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.learning.sl import Learner, distributed_run
from embodichain.plugins import sl_ddp

K, B, UPDATES, LR = 3, 4, 5, 0.1
ZERO_MICRO = (1, 1)  # (update, micro-batch) with zero weight on rank 0
ZERO_UPDATE = 2  # zero weight on every rank and micro-batch: skipped


def corpus() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g)
    return {"x": x, "y": torch.randn(64, 2, generator=g),
            "mask": (torch.rand(64, 2, generator=g) > 0.3).float()}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return sl_ddp.make_model(hidden=8)  # the built-in recipe's model


masked_mse = sl_ddp.masked_mse  # and its objective


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class CountingAllReduce:
    """Counts the collectives: the comm hook calls `dist.all_reduce` once per bucket."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = dist.all_reduce

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._real(*args, **kwargs)


def main(out: Path) -> None:
    torch.set_num_threads(1)
    counter = CountingAllReduce()
    dist.all_reduce = counter
    with distributed_run("cpu") as device:
        rank = int(os.environ["RANK"])
        data = corpus()
        sampler = ReplacementSampler(64, K * B, seed=3, rank=rank)
        learner = Learner(make_model(), OptimizerConfig(name="sgd", lr=LR), None, 100, device)
        seen: list[list[dict[str, torch.Tensor]]] = []
        before, summaries, calls = [], [], []

        def gather(indices: torch.Tensor) -> dict[str, torch.Tensor]:
            u, k = len(seen) - 1, len(seen[-1])
            batch = {name: t[indices].clone() for name, t in data.items()}
            if rank == 1:
                batch["mask"][:, 1] = 0  # uneven: rank 1 supervises target 0 only
            if u == ZERO_UPDATE or (rank == 0 and (u, k) == ZERO_MICRO):
                batch["mask"].zero_()
            seen[-1].append(batch)
            return batch

        for _ in range(UPDATES):
            seen.append([])
            before.append(params(learner.model))
            start = counter.calls
            result = learner.update(masked_mse, MicroBatches(sampler.next_indices(), B, gather))
            summaries.append({"weight": result.weight, "skipped": float(result.skipped),
                              **result.metrics})
            calls.append(counter.calls - start)
        after = params(learner.model)
        learner.release()

        seen.append([])
        single = Learner(make_model(), OptimizerConfig(name="sgd", lr=LR), None, 10, device)
        start = counter.calls
        single.update(masked_mse, MicroBatches(sampler.next_indices()[:B], B, gather))
        k1_calls = counter.calls - start
        single.release()
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"micro": seen[:UPDATES], "before": before, "after": after,
                "summaries": summaries, "allreduce_calls": calls, "k1_allreduce_calls": k1_calls},
               out / f"rank{rank}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
