"""A tensor's raw bytes, shared by digests (data identity, checkpoints) and the object
collectives. It sits at the root of `core` because data, checkpoint and distributed all
need it and none of them may import another."""

from __future__ import annotations

import ctypes

import torch


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor's elements, without NumPy (not a dependency)."""
    t = tensor.detach().cpu().contiguous()
    if not t.numel():
        return b""
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
