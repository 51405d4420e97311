"""Weighted updates through the real Learner (R-DIST-3), for tests/core/training/
test_weighted_update.py.

    torchrun --nproc-per-node=2 -m weighted_update OUT     # 2 gloo workers, DDP comm hook
    python -m weighted_update OUT                          # one process, the union batch

Every rank writes `OUT/rank{R}.pt` (one process: `OUT/single.pt`) holding, per scenario, the
parameters before and after and the Learner's update summary. The test compares the files.

The data are deterministic and the same in every mode. Rank r's batch is ROWS[r] of one fixed
table; the single process trains on the union of both (all 12 rows), which is exactly what
the two ranks see together.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.core.training.learner import UpdateResult
from embodichain.learning.sl import Learner, distributed_run
from embodichain.plugins import sl_ddp

ROWS = (range(0, 6), range(6, 12))
# Supervised targets per row (2 targets per row). Rank 0 holds 10, rank 1 holds 4: unequal, so
# a plain mean of the per-rank losses (what DDP alone does) gives a different update.
MASK = torch.tensor([
    [1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 0],   # rank 0: 10 valid targets
    [1, 0], [0, 1], [0, 0], [1, 0], [1, 0], [0, 0],   # rank 1: 4 valid targets
], dtype=torch.float32)


def table() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(20240601)
    x = torch.randn(12, 4, generator=g)
    y = torch.randn(12, 2, generator=g)
    return {"x": x, "y": y, "mask": MASK.clone()}


def make_model() -> nn.Module:
    torch.manual_seed(0)  # identical initial parameters on every rank and in every mode
    return sl_ddp.make_model(hidden=8)  # the built-in recipe's model


masked_mse = sl_ddp.masked_mse  # and its objective


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def local_batch(data: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    if world == 1:
        return {k: v.clone() for k, v in data.items()}
    rows = torch.tensor(list(ROWS[rank]))
    return {k: v[rows] for k, v in data.items()}


def as_dict(result: UpdateResult) -> dict[str, float]:
    """The result as plain values, so the test reads it with weights_only=True."""
    return {"weight": result.weight, "skipped": float(result.skipped), **result.metrics}


def one_update(optimizer: OptimizerConfig, data: dict[str, torch.Tensor], rank: int, world: int,
               device: torch.device) -> dict:
    learner = Learner(make_model(), optimizer, None, 10, device)
    before = params(learner.model)
    summary = as_dict(learner.update(masked_mse, local_batch(data, rank, world)))
    out = {"before": before, "after": params(learner.model), "summary": summary}
    learner.release()
    return out


def zero_weight_with_adam(data: dict[str, torch.Tensor], rank: int, world: int,
                          device: torch.device) -> dict:
    """A normal Adam update (so Adam has momentum), then a batch with zero total weight."""
    learner = Learner(make_model(), OptimizerConfig(name="adam", lr=0.01), None, 10, device)
    learner.update(masked_mse, local_batch(data, rank, world))
    before = params(learner.model)
    adam_steps_before = [float(s["step"]) for s in learner.optimizer.state.values()]
    empty = local_batch(data, rank, world)
    empty["mask"] = torch.zeros_like(empty["mask"])
    summary = as_dict(learner.update(masked_mse, empty))
    out = {
        "before": before,
        "after": params(learner.model),
        "summary": summary,
        "adam_steps_before": adam_steps_before,
        "adam_steps_after": [float(s["step"]) for s in learner.optimizer.state.values()],
        "scheduler_epoch": learner.scheduler.last_epoch,
    }
    # Not vacuous: the same Adam, stepped on zero gradients, does move the parameters.
    for p in learner.model.parameters():
        p.grad = torch.zeros_like(p)
    learner.optimizer.step()
    out["adam_on_zero_grads"] = params(learner.model)
    learner.release()
    return out


def main(out: Path) -> None:
    torch.set_num_threads(1)
    with distributed_run("cpu") as device:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        data = table()
        sgd = OptimizerConfig(name="sgd", lr=0.1)
        results = {
            "world_size": world,
            "sgd": one_update(sgd, data, rank, world, device),
        }
        # One rank without any supervised target: the other rank's loss alone counts.
        lopsided = {k: v.clone() for k, v in data.items()}
        lopsided["mask"][6:] = 0
        results["sgd_one_rank_empty"] = one_update(sgd, lopsided, rank, world, device)
        results["adam_zero_weight"] = zero_weight_with_adam(data, rank, world, device)
    out.mkdir(parents=True, exist_ok=True)
    name = f"rank{rank}.pt" if world > 1 else "single.pt"
    torch.save(results, out / name)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
