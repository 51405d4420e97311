"""Checkpoint writes in the background (R-CKPT-8) and the time-based save clock (R-CKPT-9).

At a save the training thread only copies the state into CPU buffers that are reused from
one save to the next (pinned when the state lives on CUDA); a thread of rank 0 then
digests, serialises, fsyncs and renames it with the same atomic `write_checkpoint` as a
synchronous save. At most one save is in flight: the next one waits for it before it
overwrites the buffers, so saves are published in step order and never interleave.

Every tensor is copied, CPU tensors included: a state dict holds references to the live
tensors (Adam's `step` lives on the CPU even for a CUDA model), and the next update changes
them in place. Skipping the copy for CPU tensors would save a later state than the
boundary's (the bug torch's DCP `async_save` once shipped).

A background failure is kept here until the trainer asks (`failure`), which it does before
every update, so that rank 0 can tell every rank through the update's all-reduce; and at
every save boundary and at the end, where rank 0 waits for the write in flight.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.file import make_checkpoint, write_checkpoint

# What rank 0 adds to the update's all-reduce (every other rank adds 0, so the sum is rank
# 0's value): a time-based snapshot is due (R-CKPT-9), or a background save failed.
SAVE_DUE, SAVE_FAILED = 1.0, 2.0


@dataclass(frozen=True)
class SaveFailure:
    """A save that failed on rank 0: which file, and why (an OS error's own words)."""

    path: Path
    reason: str

    @property
    def what(self) -> str:
        return f"saving checkpoint {self.path} failed on rank 0"

    @property
    def message(self) -> str:
        return f"{self.what}: {self.reason}"


def failure_reason(exc: BaseException, path: Path) -> str:
    """`No space left on device (/run/.step_100.pt.123.tmp)`: the reason and the file."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc} ({exc.filename or path})"
    return f"{type(exc).__name__}: {exc}"


class StagingArea:
    """CPU copies of a payload's tensors, in buffers reused by every save.

    A buffer is keyed by the tensor's place in the payload and kept while its shape and
    dtype stay the same, so a steady run allocates its copy once. Containers are copied
    too (plain values are immutable), so nothing staged aliases the live state.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._from_cuda = False

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def copy(self, value: Any) -> Any:
        """A copy of `value` whose tensors live in this area's buffers."""
        self._from_cuda = False
        staged = self._copy(value, ())
        if self._from_cuda:  # the device-to-host copies were issued without blocking
            torch.cuda.current_stream().synchronize()
        return staged

    def _copy(self, value: Any, where: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value.detach(), where)
        if type(value) in (dict, OrderedDict):
            return type(value)((k, self._copy(v, (*where, k))) for k, v in value.items())
        if type(value) in (list, tuple):
            return type(value)(self._copy(v, (*where, i)) for i, v in enumerate(value))
        return value  # str, int, float, bool, None, dtype...: immutable

    def _copy_tensor(self, tensor: torch.Tensor, where: tuple[Any, ...]) -> torch.Tensor:
        buffer = self._buffers.get(where)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pinned = tensor.is_cuda  # pinned host memory: the copy from the GPU is a DMA
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu",
                                 pin_memory=pinned)
            self._buffers[where] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        self._from_cuda |= tensor.is_cuda
        return buffer


class CheckpointWriter:
    """Writes checkpoints on rank 0: in a background thread (`background=True`), else inline.

    `write()` stages the payload and returns; `settle()` waits for the save in flight.
    Inline, `write()` raises what the write raised, as a synchronous save always did.
    """

    def __init__(self, background: bool) -> None:
        self.background = background
        self._staging = StagingArea()
        self._thread: threading.Thread | None = None
        self._failure: SaveFailure | None = None

    @property
    def staged_bytes(self) -> int:
        """The CPU memory the reused copy takes (the extra peak memory of background saves)."""
        return self._staging.nbytes

    @property
    def failure(self) -> SaveFailure | None:
        """The background save that failed, if one did (read without waiting)."""
        return self._failure

    def write(self, payload: dict[str, Any], path: Path, *, also_as: Path | None = None,
              before_publish: Callable[[], None] | None = None,
              after_publish: Callable[[], None] | None = None) -> None:
        """Write `payload` to `path` (and `also_as`), atomically and verified on load.

        `before_publish` runs once the checkpoint is serialised, before any name of it
        appears (metrics.jsonl made durable up to its step); `after_publish` once it is in
        place (retention: it only ever sees complete files, never the one being written).
        """
        if not self.background:
            _write(payload, path, also_as, before_publish, after_publish)
            return
        self.settle()  # one in flight at most: the buffers are free again after this
        if self._failure is not None:
            return  # the run stops at the next boundary; nothing after a failure is written
        try:
            staged = self._staging.copy(payload)
        except Exception as exc:  # e.g. out of memory for the copy: the same as a failed write
            self._failure = SaveFailure(path, failure_reason(exc, path))
            return
        self._thread = threading.Thread(
            target=self._run, args=(staged, path, also_as, before_publish, after_publish),
            name=f"embodichain-save-{path.name}", daemon=True)
        self._thread.start()

    def _run(self, payload: dict[str, Any], path: Path, also_as: Path | None,
             before_publish: Callable[[], None] | None,
             after_publish: Callable[[], None] | None) -> None:
        try:
            _write(payload, path, also_as, before_publish, after_publish)
        except BaseException as exc:  # kept for the training thread, which stops every rank
            self._failure = SaveFailure(path, failure_reason(exc, path))

    def settle(self) -> SaveFailure | None:
        """Wait for the save in flight (if any); the failure of any background save."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        return self._failure


def _write(payload: dict[str, Any], path: Path, also_as: Path | None,
           before_publish: Callable[[], None] | None,
           after_publish: Callable[[], None] | None) -> None:
    checkpoint = make_checkpoint(payload)  # the digest of exactly what is saved
    if before_publish is not None:
        before_publish()
    write_checkpoint(checkpoint, path, also_as=also_as)
    if after_publish is not None:
        after_publish()


class SaveClock:
    """`trainer.save_every_s` on rank 0: whether a time-based snapshot is due (R-CKPT-9).

    Rank 0's clock alone decides; its answer travels in the update's all-reduce, so every
    rank saves at the same update.
    """

    def __init__(self, every_s: float | None) -> None:
        self.every_s = every_s
        self._since = time.monotonic()

    def restart(self) -> None:
        """A snapshot was just taken (or the run just began)."""
        self._since = time.monotonic()

    def due(self) -> bool:
        return self.every_s is not None and time.monotonic() - self._since >= self.every_s


def rank_zero_note(writer: CheckpointWriter, clock: SaveClock) -> float:
    """Rank 0's contribution to the update's all-reduce (see SAVE_DUE, SAVE_FAILED)."""
    if writer.failure is not None:
        return SAVE_FAILED
    return SAVE_DUE if clock.due() else 0.0
