"""Counting the host reads of tensor values that the framework's code makes (R-GPU-1).

On a GPU each of these waits for the device: `.item()`, `.tolist()`, `.numpy()`, `float()`,
`int()`, `bool()` (also `if tensor:`), `.cpu()` and `.to("cpu")` (a literal host target: on a CPU
run `.to(device)` moves nothing). Patched on
`torch.Tensor` inside `counting_host_reads()`, they count every call made from code outside
torch itself (the framework, the recipe, the test), of a floating-point or boolean tensor:
the values an update computes. Integer tensors are left out (the sampler's indices live on
the host by design), and so are torch's own internal reads (an optimizer's step count is a
host tensor; what torch does on the device is what `torch.cuda.set_sync_debug_mode`
checks, tests/core/training/test_host_reads.py's CUDA half).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

_TORCH = str(Path(torch.__file__).resolve().parent)
READS = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__", "cpu",
         "to")


@dataclass
class HostReads:
    """The reads counted so far, each with where it was made (`file:line function`)."""

    calls: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.calls)

    def clear(self) -> None:
        self.calls.clear()


def _counted(tensor: torch.Tensor, name: str, args: tuple, kwargs: dict) -> bool:
    if not (tensor.dtype.is_floating_point or tensor.dtype == torch.bool):
        return False
    if name == "to":  # a move to the host written as such ("cpu"); on a CPU run the
        # training device is the host too, and `.to(device)` is no read there
        target = kwargs.get("device", args[0] if args else None)
        return isinstance(target, str) and target.startswith("cpu")
    return True


def _caller_outside_torch() -> str | None:
    """`file:line function` of the caller, unless the call comes from torch's own code or
    from another thread than the training one (a background save's writer works on the
    host copies the save made)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    frame = sys._getframe(2)
    path = frame.f_code.co_filename
    if str(Path(path).resolve()).startswith(_TORCH):
        return None
    return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"


@contextlib.contextmanager
def counting_host_reads() -> Iterator[HostReads]:
    """Count the host reads made inside the block (see the module's docstring)."""
    reads = HostReads()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def patched(name: str):
        original = originals[name]

        def read(self, *args, **kwargs):
            if _counted(self, name, args, kwargs):
                where = _caller_outside_torch()
                if where is not None:
                    reads.calls.append(f"{name} at {where}")
            return original(self, *args, **kwargs)

        return read

    for name in READS:
        setattr(torch.Tensor, name, patched(name))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def describe(reads: HostReads) -> str:
    """The reads, one a line, most frequent first (for an assertion's message)."""
    counts: dict[str, int] = {}
    for call in reads.calls:
        counts[call] = counts.get(call, 0) + 1
    return "\n".join(f"{n} x {c}" for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))


__all__ = ["HostReads", "counting_host_reads", "describe"]
