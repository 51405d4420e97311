"""How much of the cube's position a Diffusion Policy checkpoint's camera features hold: a
linear probe, fitted on dataset frames of some episodes and scored on the others.

    python benchmarks/image_probe.py CHECKPOINT --data DATASET [--every 10] [--held-out 10]
                                     [--split-y 0.48]

Every `--every`-th frame of the dataset (recorded with the objects' poses, as `prepare`
writes them) goes through the checkpoint's camera encoder (the EMA's weights); ridge
regressions from (a) the camera's feature, what the U-Net is conditioned on, and (b) the
backbone's maps before pooling, every cell, to the cube's (x, y, z) are fitted on all but
the last `--held-out` episodes and scored on those: the mean absolute error in mm, beside
that of predicting the mean position. A feature that locates the cube no better than the
mean leaves the policy blind to where it is, whatever it learns from the joints.
`--split-y Y` also gives the held-out error of the episodes whose cube starts below y = Y
(m) and of the others (the Diffusion Policy fails only below 0.48: RESULTS, 2026-12-07).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from embodichain.core.deploy.trained import trained_model


def probe_errors(features: np.ndarray, targets: np.ndarray, fit: np.ndarray,
                 ridge: float) -> np.ndarray:
    """Each held-out frame's absolute error per target dimension of a ridge regression."""
    design = np.c_[features, np.ones(len(features))]
    a = design[fit]
    weights = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ targets[fit])
    return np.abs(design[~fit] @ weights - targets[~fit])


def main() -> None:
    from embodichain_models.data.lerobot.dataset import LeRobotFrames
    from embodichain_models.policies.act.model import ENV_STATE, IMAGE_PREFIX  # cube x, y, z first
    from embodichain_models.policies.vision.backbone import frames_in

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--held-out", type=int, default=10)
    parser.add_argument("--split-y", type=float, default=None)
    args = parser.parse_args()

    model = trained_model(args.checkpoint, ema=True).model.eval()
    (camera, encoder), = model.cameras.items()
    key = IMAGE_PREFIX + camera
    frames = LeRobotFrames(args.data, features=[key, ENV_STATE, "episode_index"])
    picked = range(0, len(frames), args.every)
    pooled, maps, cube, episode = [], [], [], []
    with torch.no_grad():
        for start in range(0, len(picked), 64):
            items = [frames[i] for i in picked[start:start + 64]]
            images = frames_in(torch.stack([it[key] for it in items]), encoder.backbone.size)
            pooled.append(encoder(images).numpy())
            maps.append(encoder.backbone(images).flatten(1).numpy())
            cube += [it[ENV_STATE][:3].numpy() for it in items]
            episode += [int(it["episode_index"]) for it in items]
    targets, episode = np.stack(cube) * 1000, np.array(episode)
    fit = episode < episode.max() + 1 - args.held_out
    errors = {"predicting the mean position": np.abs(targets[~fit] - targets[fit].mean(0)),
              f"the camera's feature ({pooled[0].shape[1]}, {encoder.pooling})":
                  probe_errors(np.concatenate(pooled), targets, fit, 1e-3),
              f"the backbone's maps, every cell ({maps[0].shape[1]})":
                  probe_errors(np.concatenate(maps), targets, fit, 1.0)}
    groups = {"": np.ones(int((~fit).sum()), bool)}
    if args.split_y is not None:  # by where the episode's cube starts (its first frame)
        start_y = {e: targets[episode == e][0, 1] / 1000 for e in np.unique(episode)}
        low = np.array([start_y[e] < args.split_y for e in episode[~fit]])
        groups[f", cube starting at y < {args.split_y}"] = low
        groups[f", y >= {args.split_y}"] = ~low
    for label, rows in groups.items():
        print(f"{args.checkpoint}: {int(rows.sum())} held-out frames of "
              f"{len(set(episode[~fit][rows]))} episodes{label}; cube x, y, z error in mm")
        for name, error in errors.items():
            print(f"  {name + ':':56s} {np.round(error[rows].mean(0), 1)}")


if __name__ == "__main__":
    main()
