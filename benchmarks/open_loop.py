"""An ALOHA policy checkpoint against its own demonstrations, open loop: how far the action
horizon it gives for a recorded frame is from the actions the expert recorded there.

    python benchmarks/open_loop.py CHECKPOINT [CHECKPOINT ...] --data DATASET
                                   [--episodes 0 1] [--every 50] [--steps 16] [--ema]
                                   [--noises 3] [--split-y 0.48]

For frames 0, `every`, 2*`every`, ... of the given episodes, the checkpoint's policy is fed
the dataset's observations (its history, for Diffusion Policy) and its horizon (the first
`--steps` actions of ACT's chunk; a Diffusion Policy's whole horizon, which `--steps` must
then be) is compared with the recorded actions: the mean absolute difference over frames,
steps and the 14 joints, in the actions' units (radians; grippers
0-1). A Diffusion Policy samples from `--noises` fixed noises (seeds 0..n-1); the figure is
their mean. A cheap proxy of how well a checkpoint fits, minutes before a closed-loop
evaluation could say: it does not replace one (a closed loop meets states no demonstration
holds). Needs the checkpoint's recipe's plugin (embodichain-models).

`--split-y Y` also gives the error of the episodes whose cube starts below y = Y and of the
others, each with its three worst joints: whether a region the closed loop fails in is
already fitted worse on the demonstrations' own states.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from embodichain.core.deploy.trained import trained_model


def frames_of(model: torch.nn.Module, data: Path, episodes: list[int], every: int,
              steps: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The observations the model takes, the recorded actions `[frames, horizon, 14]` and the
    y where each frame's episode starts its cube."""
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.policies.act.model import ACTION, ENV_STATE

    keys = model.observation_keys()
    history = getattr(model.shape, "n_obs_steps", 1)
    fps = model.shape.fps  # the dataset's rate, recorded in the checkpoint
    past = [(i - history + 1) / fps for i in range(history)]
    deltas = {ACTION: [i / fps for i in range(steps)],
              **({k: past for k in keys} if history > 1 else {})}
    frames = LeRobotFrames(data, episodes=episodes, delta_timestamps=deltas,
                           features=[*keys, ACTION])
    picked = range(0, len(frames), every)
    batch = torch.utils.data.default_collate([frames[i] for i in picked])
    states = LeRobotFrames(data, episodes=episodes, features=[ENV_STATE])  # no video: cheap
    first_rows = [frames.episode_of(i)[1] for i in picked]
    first_y = {row: float(states[row][ENV_STATE][1]) for row in set(first_rows)}
    cube_y = torch.tensor([first_y[row] for row in first_rows])
    return {k: batch[k] for k in keys}, batch[ACTION], cube_y


def open_loop_errors(checkpoint: Path, data: Path, episodes: list[int], every: int,
                     steps: int, ema: bool, noises: int) -> tuple[torch.Tensor, torch.Tensor]:
    """|horizon - recorded| per frame and joint, `[frames, 14]` (mean over steps and noises),
    and the y where each frame's episode starts its cube."""
    model = trained_model(checkpoint, ema=ema).model.eval()
    horizon = getattr(model.shape, "horizon", steps)
    if horizon != steps:
        raise SystemExit(f"{checkpoint}: a horizon of {horizon} actions; pass --steps {horizon}")
    observations, actions, cube_y = frames_of(model, data, episodes, every, steps)
    errors = []
    with torch.no_grad():
        if hasattr(model.shape, "sampling_steps"):  # Diffusion Policy: sampled
            for seed in range(noises):
                noise = torch.randn(actions.shape, generator=torch.Generator().manual_seed(seed))
                errors.append((model.act_chunk(observations, noise) - actions).abs().mean(1))
        else:
            chunk = model.act_chunk(observations)[:, :actions.shape[1]]
            errors.append((chunk - actions).abs().mean(1))
    return torch.stack(errors).mean(0), cube_y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--episodes", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--ema", action="store_true", help="the EMA's weights")
    parser.add_argument("--noises", type=int, default=3)
    parser.add_argument("--split-y", type=float, default=None,
                        help="also by where the episode's cube starts: below this y or not")
    args = parser.parse_args()
    from embodichain_models.envs.aloha.tasks import JOINT_NAMES

    for checkpoint in args.checkpoints:
        errors, cube_y = open_loop_errors(checkpoint, args.data, args.episodes, args.every,
                                          args.steps, args.ema, args.noises)
        print(f"{checkpoint}: mean |horizon - recorded actions| {float(errors.mean()):.4f}",
              flush=True)
        if args.split_y is None:
            continue
        for label, rows in ((f"cube starting at y < {args.split_y}", cube_y < args.split_y),
                            (f"y >= {args.split_y}", cube_y >= args.split_y)):
            if not rows.any():
                continue
            per_joint = errors[rows].mean(0)
            worst = ", ".join(f"{JOINT_NAMES[j]} {float(per_joint[j]):.4f}"
                              for j in per_joint.argsort(descending=True)[:3])
            print(f"  {label}: {int(rows.sum())} frames, {float(per_joint.mean()):.4f} "
                  f"(worst: {worst})", flush=True)


if __name__ == "__main__":
    main()
