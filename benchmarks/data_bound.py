"""A data-bound recipe for benchmarks/data_loading.py: compressed 3x128x128 images, decoded
and resized to 64x64 per example, regressed by a small CNN (batch 64).

Factory `data_bound:build_supervised_trainer` (with benchmarks/ on PYTHONPATH); the dataset
and model are shared with the hand-written DataLoader loop, so both do the same work.
The compressed images live in one uint8 tensor (offsets beside it), so forked DataLoader
workers share its pages instead of copying them.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from embodichain.learning.sl import (
    DatasetSource,
    LossResult,
    Section,
    SupervisedTrainer,
    tensor_digest,
)

SIDE, OUT = 128, 64


def make_blob(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`count` smooth random images, zlib-compressed into one buffer: (blob, offsets, target)."""
    g = torch.Generator().manual_seed(seed)
    chunks, targets = [], []
    for _ in range(count):
        low = torch.rand(1, 3, 16, 16, generator=g)
        image = F.interpolate(low, size=(SIDE, SIDE), mode="bilinear", align_corners=False)[0]
        image = image + 0.05 * torch.rand(3, SIDE, SIDE, generator=g)  # some texture
        pixels = (image.clamp(0, 1) * 255).to(torch.uint8)
        chunks.append(zlib.compress(pixels.numpy().tobytes(), 6))
        targets.append(image.mean(dim=(1, 2)))
    offsets = torch.tensor([0] + [len(c) for c in chunks]).cumsum(0)
    blob = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
    return blob, offsets, torch.stack(targets)


class CompressedImages:
    """Decode (zlib), resize to 64x64 and randomly flip each example."""

    def __init__(self, blob: torch.Tensor, offsets: torch.Tensor, target: torch.Tensor) -> None:
        self.blob, self.offsets, self.target = blob, offsets, target

    def __len__(self) -> int:
        return len(self.target)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        raw = zlib.decompress(self.blob[start:end].numpy().tobytes())
        image = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(3, SIDE, SIDE)
        image = F.interpolate(image.float().div_(255).unsqueeze(0), size=(OUT, OUT),
                              mode="bilinear", antialias=True, align_corners=False)[0]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return {"image": image, "target": self.target[index]}


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 8 * 8, 3))


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    loss = (model(batch["image"]) - batch["target"]).square().mean()
    return LossResult(loss=loss, weight=torch.tensor(float(len(batch["target"]))))


class DataSection(Section):
    count: int = 2048
    seed: int = 0


@dataclass
class DataBoundConfig:
    data: DataSection = field(default_factory=DataSection)


def build_supervised_trainer(config, device: torch.device) -> SupervisedTrainer:
    blob, offsets, target = make_blob(config.data.count, config.data.seed)
    if os.environ.get("DATA_BOUND_SIZE_FILE"):  # for the PSS measurement
        Path(os.environ["DATA_BOUND_SIZE_FILE"]).write_text(str(blob.numel()))
    identity = tensor_digest({"blob": blob, "offsets": offsets, "target": target})
    source = DatasetSource(CompressedImages(blob, offsets, target), identity=identity)
    return SupervisedTrainer(config, model=make_model(), source=source, objective=mse,
                             device=device)


build_supervised_trainer.config_schema = DataBoundConfig
