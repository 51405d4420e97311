"""Immutable training corpora and per-rank sampling with replacement (R-DIST-4)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch

from embodichain.core.tensor_bytes import tensor_bytes


@runtime_checkable
class Source(Protocol):
    """An immutable corpus the trainer samples examples from.

    `identity` is a digest of the content: a checkpoint only resumes with the same data.
    """

    identity: str

    def __len__(self) -> int: ...

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """The examples at `indices` (a CPU LongTensor) as named, batched tensors."""
        ...


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes of the tensors."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


class TensorSource:
    """A corpus of equally long tensors, indexed along their first dimension."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], identity: str | None = None) -> None:
        lengths = {len(t) for t in tensors.values()}
        if len(lengths) != 1:
            raise ValueError(f"all tensors need the same length, got {sorted(lengths)}")
        self._tensors = {name: t.detach() for name, t in tensors.items()}
        self._length = lengths.pop()
        self.identity = identity or f"sha256:{tensor_digest(self._tensors)}"

    def __len__(self) -> int:
        return self._length

    def gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        device = next(iter(self._tensors.values())).device
        if device.type == "cuda" and indices.device != device:
            # Host indices into device tensors would be copied with the host waiting.
            indices = indices.pin_memory().to(device, non_blocking=True)
        return {name: t[indices] for name, t in self._tensors.items()}

    def to(self, device: torch.device) -> TensorSource:
        """The same corpus (same identity) resident on `device`."""
        return TensorSource({n: t.to(device) for n, t in self._tensors.items()}, self.identity)
