"""`trainer.precision` and `trainer.compile` (R-LOOP-4): what the device can run, checked
before training, and the autocast context of the forward pass."""

from __future__ import annotations

import contextlib
import shutil
from typing import Literal

import torch
from torch import nn

from embodichain.core.errors import UsageError

Precision = Literal["fp32", "bf16", "fp16"]
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def trainer_precision(recipe: str, factory: str | None, device: torch.device) -> str:
    """The run's precision: the recipe's `trainer.precision`, checked against the device.
    `factory` is `SupervisedTrainer(precision=)`, from before the recipe key: it may only
    agree (ValueError otherwise)."""
    if factory is not None and factory != recipe:
        raise ValueError(f"SupervisedTrainer(precision={factory!r}) differs from the "
                         f"recipe's trainer.precision: {recipe}")
    check_precision(recipe, device)
    return recipe


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse (UsageError, exit 2) a precision the device cannot train in."""
    if precision not in ("fp32", "bf16", "fp16"):
        raise UsageError(f"trainer.precision: expected fp32, bf16 or fp16, got {precision!r}")
    if precision == "fp16" and device.type != "cuda":
        raise UsageError(f"trainer.precision: fp16 needs a CUDA device, but this run trains on "
                         f"{device} (no fp16 autocast with gradient scaling there); use bf16 "
                         "or fp32")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UsageError(f"trainer.precision: bf16 is not supported by "
                         f"{torch.cuda.get_device_name(device)} ({device}); use fp16 or fp32")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


def compiled(model: nn.Module, device: torch.device) -> nn.Module:
    """`torch.compile(model)`; refused before training when inductor has no C++ compiler
    for CPU code."""
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise UsageError("trainer.compile: true on CPU needs a C++ compiler (g++ or clang++) "
                         "on PATH for torch.compile's generated code; install one or set "
                         "trainer.compile: false")
    return torch.compile(model)
