"""Record expert cart-pole swing-up demonstrations as a LeRobot v3.0 dataset.

    python -m embodichain_models.data.cartpole.prepare --out data/cartpole_bc

(needs `pip install 'embodichain-models[lerobot]'`). Each episode starts hanging near the
centre and runs the expert of `task.py` for 150 to 210 control steps at 30 Hz; every step
records `observation.state` (`[x, θ, ẋ, θ̇]`, float32), `action` (the expert's cart force,
N) and `observation.image` (the 64x64 rendered camera, an mp4 video), with the task text.
The force applied to the cart is the expert's plus Gaussian noise (`--noise`, N; "DART"
noise injection): the demonstrations then show how the expert recovers from the small
errors a learned policy makes, which plain demonstrations never visit. The physics is
NeRD's cart-pole; nothing is downloaded.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from embodichain_models.dynamics.nerd.physics import CartPoleParams
from embodichain_models.envs.cartpole.render import render
from embodichain_models.envs.cartpole.task import (
    FPS,
    TASK,
    Expert,
    control_step,
    initial_states,
)

STATE_NAMES = ["x", "theta", "x_dot", "theta_dot"]
IMAGE_KEY = "observation.image"
MIN_STEPS, EXTRA_STEPS = 150, 60
NOISE = 250.0  # N, standard deviation of the force noise applied while recording


def features(size: int) -> dict[str, dict]:
    from embodichain_models.data.lerobot.writer import feature

    return {"observation.state": feature("float32", (4,), STATE_NAMES),
            "action": feature("float32", (1,), ["force"]),
            IMAGE_KEY: feature("video", (size, size, 3))}


def demonstrations(count: int, seed: int, size: int = 64, noise: float = NOISE):
    """`count` expert episodes as `EpisodeData` (uneven lengths, deterministic in seed)."""
    from embodichain_models.data.lerobot.writer import EpisodeData

    params, expert = CartPoleParams(), Expert()
    gen = torch.Generator().manual_seed(seed + 1)
    lengths = (MIN_STEPS + torch.randint(0, EXTRA_STEPS + 1, (count,), generator=gen)).tolist()
    state = initial_states(count, seed)
    states, forces = [], []
    for _ in range(max(lengths)):
        force = expert(state)
        states.append(state.to(torch.float32))
        forces.append(force.to(torch.float32))
        applied = force + noise * torch.randn(count, generator=gen, dtype=torch.float64)
        state = control_step(state, applied, params)
    states_t, forces_t = torch.stack(states, 1), torch.stack(forces, 1)  # [N, T, ·]
    episodes = []
    for i, n in enumerate(lengths):
        frames = render(states_t[i, :n], size).permute(0, 2, 3, 1).contiguous().numpy()
        episodes.append(EpisodeData(TASK, {"observation.state": states_t[i, :n].numpy(),
                                           "action": forces_t[i, :n].numpy(),
                                           IMAGE_KEY: frames}))
    return episodes


def prepare(out: Path, episodes: int, seed: int, size: int = 64, noise: float = NOISE,
            overwrite: bool = False) -> Path:
    from embodichain_models.data.lerobot.writer import write_dataset

    return write_dataset(out, demonstrations(episodes, seed, size, noise), features(size), FPS,
                         episodes_per_file=25, robot_type="cartpole", overwrite=overwrite)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the dataset's root directory")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--size", type=int, default=64, help="camera width and height, pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--noise", type=float, default=NOISE,
                        help="std of the force noise applied while recording, N")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.overwrite:
        parser.exit(2, f"error: {args.out} exists (pass --overwrite to replace it)\n")
    root = prepare(args.out, args.episodes, args.seed, args.size, args.noise, args.overwrite)
    files = sum(1 for _ in root.glob("data/*/*.parquet"))
    print(f"wrote {root}: {args.episodes} episodes of {MIN_STEPS}..{MIN_STEPS + EXTRA_STEPS} "
          f"steps at {FPS} fps, {args.size}x{args.size} camera ({files} data files)")


if __name__ == "__main__":
    main()
