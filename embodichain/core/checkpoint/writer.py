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

The writer runs save jobs (`SaveJob`): rank 0's whole-file save (`FileSave`, DDP) or each
rank's shard save (checkpoint/sharded_writer.py, FSDP); the thread hand-off is this one.
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
from typing import Any, Protocol

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


class SaveJob(Protocol):
    """One rank's part of one save, as `CheckpointWriter` runs it.

    `stage` runs on the training thread (the copy of the live state, the only pause of
    training); `run` writes, on the writer's thread or inline, and returns the save's
    failure (any rank's, when the ranks meet in it) or None.
    """

    path: Path

    def stage(self, staging: StagingArea) -> None: ...

    def staging_failed(self, reason: str) -> None: ...

    def run(self) -> SaveFailure | None: ...


class CheckpointWriter:
    """Runs a rank's save jobs: in a background thread (`background=True`), else inline.

    `write()` stages the job and returns; `settle()` waits for the save in flight and
    returns the failure of any save, which is kept: nothing is written after it.
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
        """The save that failed, if one did (read without waiting)."""
        return self._failure

    def write(self, job: SaveJob) -> None:
        """Run `job`: staged now, written on the thread (or inline, then its failure is
        `failure` on return)."""
        self.settle()  # one in flight at most: the buffers are free again after this
        if self._failure is not None:
            return  # the run stops at the next boundary; nothing after a failure is written
        if not self.background:
            try:
                self._failure = job.run()
            except Exception as exc:  # every rank must hear of it, or the others would hang
                self._failure = SaveFailure(job.path, failure_reason(exc, job.path))
            return
        try:
            job.stage(self._staging)
        except Exception as exc:  # e.g. out of memory for the copy: the job reports it (a
            job.staging_failed(f"{type(exc).__name__}: {exc}")  # sharded one still meets)
        self._thread = threading.Thread(target=self._run, args=(job,), daemon=True,
                                        name=f"embodichain-save-{job.path.name}")
        self._thread.start()

    def _run(self, job: SaveJob) -> None:
        try:
            self._failure = job.run()
        except BaseException as exc:  # kept for the training thread, which stops every rank
            self._failure = SaveFailure(job.path, failure_reason(exc, job.path))

    def settle(self) -> SaveFailure | None:
        """Wait for the save in flight (if any); the failure of any save."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        return self._failure


class FileSave:
    """Rank 0's save of a whole payload into one checkpoint file (and `also_as`)."""

    def __init__(self, payload: dict[str, Any], path: Path, *, also_as: Path | None = None,
                 before_publish: Callable[[], None] | None = None,
                 after_publish: Callable[[], None] | None = None) -> None:
        """`before_publish` runs once the checkpoint is serialised, before any name of it
        appears (metrics.jsonl made durable up to its step); `after_publish` once it is in
        place (retention: it only ever sees complete files, never the one being written)."""
        self.payload, self.path, self.also_as = payload, path, also_as
        self.before_publish, self.after_publish = before_publish, after_publish
        self._staging_error: str | None = None

    def stage(self, staging: StagingArea) -> None:
        self.payload = staging.copy(self.payload)

    def staging_failed(self, reason: str) -> None:
        self._staging_error = reason

    def run(self) -> SaveFailure | None:
        if self._staging_error is not None:
            return SaveFailure(self.path, self._staging_error)
        checkpoint = make_checkpoint(self.payload)  # the digest of exactly what is saved
        if self.before_publish is not None:
            self.before_publish()
        write_checkpoint(checkpoint, self.path, also_as=self.also_as)
        if self.after_publish is not None:
            self.after_publish()
        return None


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
