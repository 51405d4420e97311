"""`trainer.activation_checkpointing` (R-OPS-4): peak activation memory and time per update,
with and without, on the NeRD transformer and the ACT camera policy, in one process.

Each model is built twice from one seed (a plain copy and one whose named module classes are
checkpointed by `apply_activation_checkpointing`, what `train-sl` applies) and trained with
its own recipe's objective and Adam on a synthetic batch of the recipe's size.

Memory: torch's `MemTracker` (torch.distributed._tools.mem_tracker), a TorchDispatchMode that
sees the storage of every tensor any operator creates (forward, recomputation, backward) and
counts each storage once, by category (parameters, buffers, gradients, optimizer state,
activations, backward temporaries). It is exact and deterministic on CPU, where torch has no
allocator statistics; the process's RSS is not (glibc keeps freed pages, and other processes
on a shared machine move it). One update's forward and backward run under the tracker (the
optimizer step is the same with or without checkpointing); the figure is the activations and
backward temporaries at the moment of the update's peak, i.e. the peak less the parameters,
buffers, gradients and optimizer state held at that moment.

Time: the two copies train alternately, `--rounds` blocks of `--updates` updates each (the
order flipped every round), so that a shared machine's load falls on both alike; the figure
is the median over rounds of a block's seconds per update, and the ratio the median of each
round's own ratio. A check first trains both copies
two updates from one RNG state and compares their weights bitwise.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/activation_checkpointing.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from embodichain.core.training.activation_checkpointing import apply_activation_checkpointing
from embodichain.learning.sl import LossResult


@dataclass(frozen=True)
class Case:
    """A model of a recipe, its objective, a batch of the recipe's size and what to
    checkpoint."""

    name: str
    model: Callable[[], nn.Module]
    objective: Callable[[nn.Module, dict[str, torch.Tensor]], LossResult]
    batch: Callable[[], dict[str, torch.Tensor]]
    modules: tuple[str, ...]
    lr: float


def nerd(layers: int) -> Case:
    """examples/learning/nerd/configs/cartpole/sl.train.yaml: 256 windows of 10 frames,
    d_model 64, 4 heads (the recipe's 2 layers, or more)."""
    from embodichain_models.dynamics.nerd.model import NerdModelConfig, NerdTransformer
    from embodichain_models.dynamics.nerd.sl_recipe import make_objective

    def batch() -> dict[str, torch.Tensor]:
        return {"states": torch.randn(256, 10, 4), "actions": torch.randn(256, 10, 2),
                "deltas": torch.randn(256, 10, 4)}

    return Case(f"nerd (layers {layers}, batch 256 x 10)",
                lambda: NerdTransformer(NerdModelConfig(layers=layers, d_model=64, heads=4,
                                                        window=10, dropout=0.1)),
                make_objective(False), batch, ("Block",), 1e-3)


def act_camera(modules: tuple[str, ...]) -> Case:
    """examples/learning/aloha/transfer_cube_camera.yaml: a micro-batch of 16, the top camera
    at 120x160, chunks of 50, hidden 128, 2 encoder and 1 decoder layers, backbone width 32."""
    from embodichain_models.policies.act.model import (
        ACTION,
        STATE,
        ActPolicy,
        ActShape,
        objective,
    )

    shape = ActShape(state_dim=14, env_dim=0, action_dim=14, chunk=50, cameras=("top",),
                     hidden=128, heads=4, encoder_layers=2, decoder_layers=1, feedforward=512,
                     dropout=0.1, channels=32, image_sizes=((120, 160),), image_shift=6)
    stats = {key: {"mean": torch.zeros(14), "std": torch.ones(14)} for key in (STATE, ACTION)}

    def batch() -> dict[str, torch.Tensor]:
        return {STATE: torch.randn(16, 14), "observation.images.top": torch.rand(16, 3, 120, 160),
                ACTION: torch.randn(16, 50, 14),
                "action_is_pad": torch.zeros(16, 50, dtype=torch.bool)}

    return Case(f"act camera (batch 16, 120x160): {', '.join(modules)}",
                lambda: ActPolicy(shape, stats), objective, batch, modules, 3e-4)


def built(case: Case, checkpointed: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = case.model().train()
    if checkpointed:
        apply_activation_checkpointing(model, case.modules)
    return model, torch.optim.Adam(model.parameters(), lr=case.lr)


def update(case: Case, model: nn.Module, optimizer: torch.optim.Optimizer,
           batch: dict[str, torch.Tensor]) -> float:
    """One update; the seconds its forward took."""
    started = time.perf_counter()
    loss = case.objective(model, batch).loss
    forward = time.perf_counter() - started
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return forward


def same_training(case: Case) -> bool:
    """Two updates of each copy from one RNG state: bitwise the same weights?"""
    weights = []
    for checkpointed in (False, True):
        model, optimizer = built(case, checkpointed)
        torch.manual_seed(1)
        for _ in range(2):
            update(case, model, optimizer, case.batch())
        weights.append([p.detach().clone() for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def peak_memory(case: Case, checkpointed: bool) -> dict[str, int]:
    """One forward and backward under MemTracker, after a first update (Adam's state
    exists): the categories at the peak, in bytes, and the peak itself."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model, optimizer = built(case, checkpointed)
    batch = case.batch()
    update(case, model, optimizer, batch)
    tracker = MemTracker()
    tracker.track_external(model, optimizer, *batch.values())
    with tracker:
        case.objective(model, batch).loss.backward()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    return {getattr(k, "value", k): int(v) for k, v in peak.items()}


def activations(peak: dict[str, int]) -> int:
    return peak["Activation"] + peak["Temp"]


def seconds_per_update(case: Case, rounds: int, updates: int
                       ) -> tuple[float, float, float, float]:
    """Rounds of `updates` updates of each copy, the order flipped every round, after one
    update of each: the median seconds per update of each, the median over rounds of the
    round's ratio (checkpointed / plain: the two blocks of a round ran under the same load),
    and the plain update's share of time in its forward (what recomputing all of the
    forward would add)."""
    copies = {c: built(case, c) for c in (False, True)}
    batch = case.batch()
    for model, optimizer in copies.values():
        update(case, model, optimizer, batch)
    blocks: dict[bool, list[float]] = {False: [], True: []}
    shares = []
    for r in range(rounds):
        for checkpointed in ((False, True) if r % 2 == 0 else (True, False)):
            model, optimizer = copies[checkpointed]
            started = time.perf_counter()
            forward = sum(update(case, model, optimizer, batch) for _ in range(updates))
            elapsed = time.perf_counter() - started
            blocks[checkpointed].append(elapsed / updates)
            if not checkpointed:
                shares.append(forward / elapsed)
    ratios = [c / p for p, c in zip(blocks[False], blocks[True], strict=True)]
    return (statistics.median(blocks[False]), statistics.median(blocks[True]),
            statistics.median(ratios), statistics.median(shares))


def report(case: Case, rounds: int, updates: int) -> dict[str, Any]:
    same = same_training(case)
    plain, checkpointed = peak_memory(case, False), peak_memory(case, True)
    s_plain, s_ckpt, ratio, share = seconds_per_update(case, rounds, updates)
    mib = 2 ** 20
    row = {"case": case.name, "same_weights": same, "act_plain_mib": activations(plain) / mib,
           "act_ckpt_mib": activations(checkpointed) / mib,
           "peak_plain_mib": plain["Total"] / mib, "peak_ckpt_mib": checkpointed["Total"] / mib,
           "s_plain": s_plain, "s_ckpt": s_ckpt, "time_ratio": ratio, "forward_share": share}
    row["act_lower"] = 1 - row["act_ckpt_mib"] / row["act_plain_mib"]
    print(f"{row['case']}: weights bitwise equal: {same}; activations at the peak "
          f"{row['act_plain_mib']:.1f} -> {row['act_ckpt_mib']:.1f} MiB "
          f"({100 * row['act_lower']:.0f}% lower); peak {row['peak_plain_mib']:.1f} -> "
          f"{row['peak_ckpt_mib']:.1f} MiB; update {1000 * row['s_plain']:.1f} -> "
          f"{1000 * row['s_ckpt']:.1f} ms ({row['time_ratio']:.2f}x; the forward is "
          f"{100 * share:.0f}% of a plain update)", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--case", action="append", default=None,
                        help="nerd, nerd8 or act (default: all)")
    args = parser.parse_args()
    cases = {"nerd": lambda: nerd(2), "nerd8": lambda: nerd(8),
             "act": lambda: act_camera(("BasicBlock", "TransformerEncoderLayer",
                                        "TransformerDecoderLayer"))}
    for name in args.case or list(cases):
        report(cases[name](), args.rounds, args.updates)


if __name__ == "__main__":
    main()
