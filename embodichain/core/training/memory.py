"""Memory figures (R-OPS-3): each rank's peak, the out-of-memory message and torch's
allocator snapshot.

The peak is CUDA's `max_memory_allocated` on a GPU and the process's peak resident set
(`getrusage`) on the CPU: both host-side counters, read without waiting for the device. It
rides the update's all-reduce in a slot per rank (learner.py), so rank 0 logs every rank's
as `memory/peak_rank_R` (bytes) and their largest as `memory/peak`.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch

from embodichain.core.observe.progress import log

MEMORY_DIR = "memory"
_GIB = 2**30


def peak_bytes(device: torch.device) -> float:
    """This process's peak memory so far: allocated on `device` (CUDA), else resident."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # Linux: KiB


def peak_metrics(peaks: tuple[float, ...]) -> dict[str, float]:
    """`memory/peak` (the largest over ranks) and `memory/peak_rank_R`, in bytes."""
    if not peaks:
        return {}
    return {"memory/peak": max(peaks),
            **{f"memory/peak_rank_{r}": p for r, p in enumerate(peaks)}}


def out_of_memory_message(error: BaseException, device: torch.device, step: int,
                          snapshot: Path | None = None) -> str:
    """One message for a CUDA out-of-memory error at update `step`: this rank's peak, the
    device's total and the knobs that lower it."""
    if device.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device).total_memory
        figures = (f"peak {peak_bytes(device) / _GIB:.2f} GiB allocated of the device's "
                   f"{total / _GIB:.2f} GiB")
    else:
        figures = f"peak {peak_bytes(device) / _GIB:.2f} GiB resident"
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else "out of memory"
    return (f"out of memory on {device} in update {step + 1} ({figures}): {first_line}. "
            "To need less: a smaller trainer.batch_size under the same "
            "trainer.global_batch_size (more micro-batches, the same update), "
            "trainer.precision: bf16, trainer.activation_checkpointing on the model's "
            "repeated blocks"
            + (f"; the allocator's snapshot is {snapshot} (open it at "
               "pytorch.org/memory_viz)" if snapshot is not None
               else "; trainer.memory_snapshot: true writes the allocator's snapshot"
               if device.type == "cuda" else ""))


def start_recording(device: torch.device, wanted: bool) -> bool:
    """Begin torch's allocator history for `trainer.memory_snapshot` (CUDA only; on the CPU
    a warning says no snapshot is written); whether it records."""
    if not wanted:
        return False
    if device.type != "cuda":
        log.warning("trainer.memory_snapshot: torch's allocator snapshot exists for CUDA "
                    "only; training on %s writes none (memory/peak is still logged)", device)
        return False
    torch.cuda.memory._record_memory_history(max_entries=100_000, device=device)
    return True


def dump_allocator_snapshot(directory: Path, rank: int, label: str) -> Path:
    """Write torch's allocator snapshot to `RUN/memory/rank_R.LABEL.pickle`."""
    path = directory / MEMORY_DIR / f"rank_{rank}.{label}.pickle"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._dump_snapshot(str(path))
    return path
