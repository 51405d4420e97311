"""Per-rank state that a checkpoint keeps for every rank: RNG streams and model buffers.

Everything is stored as tensors and plain values (NumPy's state array becomes a tensor), so
checkpoints load with `weights_only=True` and no allow-list (R-CKPT-1, R-CKPT-3).
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

try:  # NumPy is optional; its global RNG is saved when it is importable.
    import numpy
except ImportError:  # pragma: no cover - numpy present in most environments
    numpy = None  # type: ignore[assignment]


def capture_rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch_cpu": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
        "python": _plain(random.getstate()),
        "numpy": None,
    }
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")),
                          "pos": int(pos), "has_gauss": int(has_gauss),
                          "cached_gaussian": float(cached)}
    return state


def restore_rng(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    random.setstate(_python_state(state["python"]))
    if numpy is not None and state.get("numpy") is not None:
        np_state = state["numpy"]
        numpy.random.set_state((np_state["kind"], np_state["keys"].numpy().astype("uint32"),
                                np_state["pos"], np_state["has_gauss"],
                                np_state["cached_gaussian"]))


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """Run a block (validation) without disturbing the training RNG streams."""
    saved = capture_rng(device)
    try:
        yield
    finally:
        restore_rng(saved, device)


def continued_from(rank: int, world_size: int, saved_world_size: int) -> int:
    """The old rank whose own state new rank `rank` continues from (R-ELASTIC-3): its own at
    the same world size; on another world size old rank 0's (its buffers, e.g. BatchNorm
    statistics, and its sampler position, which under G is the same on every rank)."""
    return rank if world_size == saved_world_size else 0


def seed_streams(seed: int) -> None:
    """Seed this process's random streams (torch CPU and CUDA, Python, NumPy)."""
    torch.manual_seed(seed)
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed % (2**32))


def continued_stream_seed(seed: int, step: int, rank: int) -> int:
    """The seed of rank `rank`'s random streams (dropout, ...) when a run continues at update
    `step` on another world size: a function of (seed, update, rank), since the old streams
    belonged to ranks of another world. The one thing that differs from a run that was never
    interrupted (docs/recovery.md)."""
    digest = hashlib.sha256(f"embodichain-continued:{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**32)


def capture_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: buf.detach().cpu().clone() for name, buf in model.named_buffers()}


def restore_buffers(model: nn.Module, buffers: Mapping[str, torch.Tensor]) -> None:
    own = dict(model.named_buffers())
    if set(own) != set(buffers):
        raise ValueError(f"buffer names differ: model {sorted(own)}, checkpoint {sorted(buffers)}")
    with torch.no_grad():
        for name, buf in own.items():
            buf.copy_(buffers[name])


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _python_state(value: Any) -> Any:
    version, internal, gauss = value
    return (version, tuple(internal), gauss)
