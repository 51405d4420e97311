"""A policy trained by lerobot's `lerobot-train` (ACT) acting in our ALOHA environment.

The thin adapter around lerobot's `select_action` that `vs_lerobot.py judge` uses to judge
a lerobot-trained policy on the same test seeds, the same environment and the same
verdicts (field and strict, `AlohaJudge`) as ours. It normalises as lerobot's own
preprocessor does (`NormalizerProcessorStep`, mode MEAN_STD for every feature of ACT):
`(x - mean) / (std + 1e-8)` with the dataset's `meta/stats.json` (the cameras' per-channel
statistics, or ImageNet's where the run kept lerobot's `dataset.use_imagenet_stats`), and
maps the normalised action back as its postprocessor does (`x * std + mean`). A camera's
480x640 uint8 frame is averaged down to the dataset's frame size exactly as our policy's
(`frames_in`), then put in [0, 1] as lerobot's training loop puts a decoded frame.

The normalisation is pure torch (no lerobot import), so the suite checks it without
lerobot installed; `vs_lerobot.py judge` checks it against lerobot's own preprocessor on
the first observation before any episode runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE, ACTION, IMAGE_PREFIX = "observation.state", "action", "observation.images."
EPS = 1e-8
"""lerobot's `NormalizerProcessorStep.eps`: added to the std before dividing."""
IMAGENET = {"mean": [[[0.485]], [[0.456]], [[0.406]]], "std": [[[0.229]], [[0.224]], [[0.225]]]}
"""lerobot's IMAGENET_STATS (utils/constants.py), shaped (3, 1, 1)."""


def read_stats(root: Path | str, keys: list[str], imagenet_cameras: bool = False
               ) -> dict[str, dict[str, torch.Tensor]]:
    """mean and std of `keys` from the dataset's `meta/stats.json`, as float32 tensors (a
    camera's shaped (3, 1, 1), as lerobot keeps them); the cameras' replaced by ImageNet's
    when `imagenet_cameras` (lerobot-train's `dataset.use_imagenet_stats`)."""
    path = Path(root) / "meta" / "stats.json"
    stats = json.loads(path.read_text())
    out = {}
    for key in keys:
        if key not in stats:
            raise KeyError(f"{path}: no statistics for {key!r} (it has {sorted(stats)})")
        entry = IMAGENET if imagenet_cameras and key.startswith(IMAGE_PREFIX) else stats[key]
        out[key] = {k: torch.tensor(entry[k], dtype=torch.float32) for k in ("mean", "std")}
    return out


class LerobotNormalisation:
    """lerobot's MEAN_STD normalisation of observations and un-normalisation of actions."""

    def __init__(self, stats: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        self.stats = stats

    def observation(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out = {}
        for key, value in batch.items():
            s = self.stats[key]
            out[key] = (value - s["mean"]) / (s["std"] + EPS)
        return out

    def action(self, normalised: torch.Tensor) -> torch.Tensor:
        s = self.stats[ACTION]
        return normalised * s["std"] + s["mean"]


def camera_input(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 `[B, H, W, 3]` camera frames as float `[B, 3, *size]` in [0, 1], averaged
    down as our policy averages them."""
    from embodichain_models.policies.vision.backbone import frames_in

    return frames_in(frames, size)


class LerobotActAdapter:
    """`reset()`, `act(observations) -> actions [B, 14]` for gym-aloha's
    `pixels_agent_pos` observations of B scenes stepped together: lerobot's
    `policy.select_action` (its own chunk queue or temporal ensembling) between its
    normalisation and un-normalisation."""

    def __init__(self, policy: Any, normalisation: LerobotNormalisation,
                 cameras: Mapping[str, tuple[int, int]]) -> None:
        self.policy, self.normalisation, self.cameras = policy, normalisation, dict(cameras)

    def reset(self) -> None:
        self.policy.reset()

    def inputs(self, observations: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """The raw batch lerobot's preprocessor would take (state float32, cameras in [0, 1])."""
        batch = {STATE: torch.as_tensor(np.asarray(observations["agent_pos"]),
                                        dtype=torch.float32)}
        for camera, size in self.cameras.items():
            frames = torch.from_numpy(np.ascontiguousarray(observations["pixels"][camera]))
            batch[IMAGE_PREFIX + camera] = camera_input(frames, size)
        return batch

    @torch.no_grad()
    def act(self, observations: Mapping[str, Any]) -> np.ndarray:
        batch = self.normalisation.observation(self.inputs(observations))
        return self.normalisation.action(self.policy.select_action(batch)).numpy()

