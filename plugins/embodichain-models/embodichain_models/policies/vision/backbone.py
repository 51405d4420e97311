"""The camera policy's image path: frames as the camera gives them to the backbone's size
(`frames_in`), random-shift augmentation (`random_shift`), and a ResNet-18-style encoder
trained from scratch (`ResNetEncoder`) whose last feature map becomes the transformer's
tokens, as ACT's.

Our own module rather than torchvision's `resnet18`: torchvision 0.28.0 matches torch 2.13,
but its ResNet fixes the widths (64..512, too slow for 2 CPU cores: measured 0.79 s an update
at width 64 against 0.24 s at width 32, batch 32 at 120x160) and uses BatchNorm. Without
pretrained weights (not reachable here) nothing of torchvision's is reused, and BatchNorm's
batch statistics would make an update depend on how the global batch is split over ranks
and micro-batches (and its running statistics differ between training and acting); GroupNorm
does neither, as Diffusion Policy replaces BatchNorm with GroupNorm for its ResNet-18.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def frames_in(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """float `[B, 3, *size]` in [0, 1] of camera frames: uint8 `[B, H, W, 3]` (as a camera,
    and gym-aloha, gives them) or float `[B, 3, H, W]` in [0, 1] (as the dataset decodes
    them), averaged down to `size` over H/h x W/w blocks (both whole: 480x640 to 120x160
    averages 4x4 blocks, as `prepare --size` does)."""
    if frames.dtype == torch.uint8:
        if frames.dim() != 4 or frames.shape[-1] != 3:
            raise ValueError(f"camera frames: uint8 [B, H, W, 3], got {list(frames.shape)}")
        images = frames.permute(0, 3, 1, 2).float() / 255.0
    else:
        images = frames.float()
    height, width = images.shape[-2:]
    if (height, width) != tuple(size):
        fy, fx = height // size[0], width // size[1]
        if fy * size[0] != height or fx * size[1] != width or fy < 1 or fx < 1:
            raise ValueError(f"camera frames of {height}x{width}: the policy sees "
                             f"{size[0]}x{size[1]}, a whole fraction of the frame it takes")
        images = F.avg_pool2d(images, (fy, fx))
    return images


def random_shift(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Each image shifted by up to `pad` pixels each way (edges replicated), DrQ's and
    Diffusion Policy's random crop; offsets from torch's generator (restored on resume)."""
    n, _, height, width = images.shape
    padded = F.pad(images, (pad, pad, pad, pad), mode="replicate")
    offsets = torch.randint(0, 2 * pad + 1, (n, 2)).tolist()
    return torch.stack([padded[i, :, y:y + height, x:x + width]
                        for i, (y, x) in enumerate(offsets)])


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(max(1, channels // 16), channels)  # Diffusion Policy's groups


class BasicBlock(nn.Module):
    """ResNet's basic block (two 3x3 convolutions and the identity or a strided 1x1)."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False)
        self.norm1 = _norm(outputs)
        self.conv2 = nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False)
        self.norm2 = _norm(outputs)
        self.down = (nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                   _norm(outputs))
                     if stride != 1 or inputs != outputs else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(out)) + self.down(x))


def feature_grid(size: tuple[int, int]) -> tuple[int, int]:
    """Rows and columns of the encoder's last feature map for images of `size` (5 halvings,
    each rounding up as a stride-2 convolution with padding does)."""
    return _halved(size[0], 5), _halved(size[1], 5)


def _halved(n: int, times: int) -> int:
    for _ in range(times):
        n = (n + 1) // 2
    return n


class ResNetEncoder(nn.Module):
    """ResNet-18's layout (a 7x7 stem, max pool, 4 stages of 2 basic blocks, widths
    w, 2w, 4w, 8w) with GroupNorm, trained from scratch; images `[B, 3, *size]` in [0, 1]
    to tokens `[B, cells, hidden]` (the last feature map, 1/32 of the size, through a 1x1
    projection as ACT's `input_proj`)."""

    def __init__(self, width: int, hidden: int, size: tuple[int, int]) -> None:
        super().__init__()
        self.size = (int(size[0]), int(size[1]))
        rows, cols = feature_grid(self.size)
        self.cells = rows * cols
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1),
                             persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1),
                             persistent=False)
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), _norm(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages, inputs = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            outputs = width * 2 ** i
            stages += [BasicBlock(inputs, outputs, stride), BasicBlock(outputs, outputs, 1)]
            inputs = outputs
        self.stages = nn.Sequential(*stages)
        self.project = nn.Conv2d(inputs, hidden, 1)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.stages(self.stem((images - self.mean) / self.std))
        return self.project(features).flatten(2).transpose(1, 2)
