"""Simulate the cart-pole training and validation sets for the NeRD recipe.

    python -m embodichain_models.dynamics.nerd.prepare --out data/nerd/cartpole

writes `train.pt` and `val.pt`: `torch.save` dicts of plain tensors (`states [N, T+1, 4]`,
`actions [N, T, 2]`, float32) and plain metadata, so every rank can open them with
`torch.load(path, mmap=True, weights_only=True)` and share the pages. The same arguments
give byte-identical files.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from embodichain_models.dynamics.nerd.physics import (
    ACTION_NAMES,
    STATE_NAMES,
    THETA,
    CartPoleParams,
    SamplingRanges,
    random_trajectories,
)

FORMAT = "embodichain-models/nerd-cartpole"
FORMAT_VERSION = 1


def build_split(
    num: int,
    steps: int,
    seed: int,
    params: CartPoleParams | None = None,
    ranges: SamplingRanges | None = None,
) -> dict[str, Any]:
    """Simulate one split and return the dict that is saved: tensors plus plain metadata."""
    params = params or CartPoleParams()
    ranges = ranges or SamplingRanges()
    states, actions = random_trajectories(num, steps, seed, params, ranges)
    states, actions = states.to(torch.float32), actions.to(torch.float32)
    # θ just below π in float64 can round up to float32 π: keep the stored θ in [−π, π).
    theta = states[..., THETA]
    states[..., THETA] = torch.where(theta >= math.pi, theta - 2 * math.pi, theta)
    # Checked after the float32 cast so an overflow there is caught too.
    finite = states.isfinite().flatten(1).all(1) & actions.isfinite().flatten(1).all(1)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "states": states[finite].contiguous(),
        "actions": actions[finite].contiguous(),
        "state_names": list(STATE_NAMES),
        "action_names": list(ACTION_NAMES),
        "seed": seed,
        "steps": steps,
        "requested_trajectories": num,
        "dropped_trajectories": int((~finite).sum()),
        "physics": params.as_dict(),
        "sampling": ranges.as_dict(),
    }


def save_split(split: dict[str, Any], path: Path) -> None:
    """Write atomically, so a reader never sees a half-written `.pt` file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Saving through a file object names the archive inside "archive" whatever the file is
    # called, so the temp-then-rename dance keeps the bytes reproducible. The temp name does
    # not end in .pt, so `*.pt` only ever matches complete files.
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        torch.save(split, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_split(path: str | Path, mmap: bool = True) -> dict[str, Any]:
    """Load a split safely (no code execution), memory-mapped by default."""
    data = torch.load(path, map_location="cpu", mmap=mmap, weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a NeRD cart-pole dataset (format {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} has format version {data.get('format_version')}, "
                         f"expected {FORMAT_VERSION}; prepare the data again")
    return data


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embodichain_models.dynamics.nerd.prepare",
        description="Simulate cart-pole trajectories for the NeRD recipe.")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--train-trajectories", type=int, default=2000)
    parser.add_argument("--val-trajectories", type=int, default=200)
    parser.add_argument("--steps", type=int, default=100, help="frames per trajectory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training split")
    parser.add_argument("--val-seed", type=int, default=10, help="seed of the validation split")
    parser.add_argument("--dt", type=float, default=CartPoleParams.dt, help="frame time, s")
    parser.add_argument("--substeps", type=int, default=CartPoleParams.substeps)
    parser.add_argument("--force", type=float, default=SamplingRanges.force,
                        help="forces are uniform in [-FORCE, FORCE] N")
    args = parser.parse_args(argv)
    if min(args.train_trajectories, args.val_trajectories, args.steps, args.substeps) < 1:
        parser.error("trajectory counts, --steps and --substeps must be positive")
    if args.seed == args.val_seed:
        parser.error("--seed and --val-seed must differ (independent validation set)")

    params = CartPoleParams(dt=args.dt, substeps=args.substeps)
    ranges = SamplingRanges(force=args.force)
    for name, num, seed in (("train", args.train_trajectories, args.seed),
                            ("val", args.val_trajectories, args.val_seed)):
        split = build_split(num, args.steps, seed, params, ranges)
        path = args.out / f"{name}.pt"
        save_split(split, path)
        print(f"{path}: {len(split['states'])} trajectories x {args.steps} steps "
              f"(seed {seed}, {split['dropped_trajectories']} dropped as non-finite)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
