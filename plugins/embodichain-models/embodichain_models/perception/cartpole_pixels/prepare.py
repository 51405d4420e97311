"""Render simulated cart-pole trajectories into HDF5 files for the cart-pole-from-pixels recipe.

    python -m embodichain_models.perception.cartpole_pixels.prepare --out data/cartpole_pixels

writes `train.h5` and `val.h5` (needs h5py: `pip install 'embodichain-models[hdf5]'`), each
with `frames` (uint8 `[trajectories, steps+1, 3, size, size]`, one gzip-compressed chunk per
frame, so an example decodes only its own frames) and `states` (float32 `[trajectories,
steps+1, 4]`: x, θ, ẋ, θ̇). Each file's content digest (cached per user, never beside the
file) is the training source's identity. The physics is NeRD's cart-pole (no simulator needed).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from embodichain.learning.sl import file_digest
from embodichain_models.dynamics.nerd.physics import THETA, CartPoleParams, random_trajectories
from embodichain_models.envs.cartpole.render import render

FORMAT = "embodichain-models/cartpole-pixels"
_RENDER_CHUNK = 1024


def write_split(path: Path, trajectories: int, steps: int, seed: int, size: int) -> str:
    """Simulate, render and write one split; returns its content digest."""
    import h5py

    params = CartPoleParams()
    states, _ = random_trajectories(trajectories, steps, seed, params)
    states = states.to(torch.float32)
    theta = states[..., THETA]  # float32 rounding may reach π: keep θ in [−π, π)
    states[..., THETA] = torch.where(theta >= math.pi, theta - 2 * math.pi, theta)
    flat = states.reshape(-1, 4)
    frames = torch.cat([render(flat[i:i + _RENDER_CHUNK], size)
                        for i in range(0, len(flat), _RENDER_CHUNK)])
    frames = frames.reshape(trajectories, steps + 1, 3, size, size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w", track_order=False) as f:
        f.attrs.update({"format": FORMAT, "size": size, "steps": steps, "seed": seed,
                        "dt": params.dt})
        f.create_dataset("frames", data=frames.numpy(), chunks=(1, 1, 3, size, size),
                         compression="gzip", compression_opts=4, track_times=False)
        f.create_dataset("states", data=states.numpy(), track_times=False)
    tmp.replace(path)
    return file_digest(path)  # computed now and cached beside the file


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for train.h5, val.h5")
    parser.add_argument("--train-trajectories", type=int, default=200)
    parser.add_argument("--val-trajectories", type=int, default=20)
    parser.add_argument("--steps", type=int, default=50, help="frames per trajectory, minus 1")
    parser.add_argument("--size", type=int, default=64, help="frame width and height, pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-seed", type=int, default=10)
    args = parser.parse_args(argv)
    for name, count, seed in (("train", args.train_trajectories, args.seed),
                              ("val", args.val_trajectories, args.val_seed)):
        digest = write_split(args.out / f"{name}.h5", count, args.steps, seed, args.size)
        print(f"wrote {args.out / f'{name}.h5'}: {count} trajectories x {args.steps + 1} "
              f"frames of {args.size}x{args.size} ({digest})")


if __name__ == "__main__":
    main()
