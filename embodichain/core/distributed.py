"""Process-group lifetime and the few collectives the framework uses (R-DIST-1, R-DIST-5)."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from embodichain.core.errors import UsageError


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_rank_zero() -> bool:
    return rank() == 0


def env_rank() -> int:
    """The global rank torchrun assigned, readable before any process group exists."""
    return int(os.environ.get("RANK", "0"))


def resolve_device(device: str | torch.device) -> torch.device:
    """Map `cpu | cuda | auto` to this worker's device (`cuda:LOCAL_RANK` under torchrun)."""
    kind = str(device)
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(
                "device: cuda was requested but CUDA is not available on this machine "
                "(use `device: cpu` or `device: auto`)"
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if local_rank >= torch.cuda.device_count():
            raise UsageError(
                f"LOCAL_RANK {local_rank} has no GPU: only {torch.cuda.device_count()} visible "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                "use at most that many workers per node"
            )
        return torch.device("cuda", local_rank)
    if kind != "cpu":
        raise UsageError(f"device: expected cpu, cuda or auto, got {kind!r}")
    return torch.device("cpu")


@contextlib.contextmanager
def distributed_run(device: str | torch.device = "auto") -> Iterator[torch.device]:
    """Run a block on every worker, with a process group when launched by torchrun.

    Under torchrun (WORLD_SIZE > 1) and with no group yet, this creates one (gloo on CPU,
    NCCL on CUDA) and destroys it on exit, normal or not; a group that already existed stays
    the caller's. In a single process no group is created. Yields the resolved device.
    """
    resolved = resolve_device(device)
    owns_group = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not is_distributed():
        if resolved.type == "cuda":
            torch.cuda.set_device(resolved)
            dist.init_process_group("nccl", device_id=resolved)
        else:
            dist.init_process_group("gloo")
        owns_group = True
    elif resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    try:
        yield resolved
    finally:
        if owns_group:
            # Objects that hold the group (DDP reducers) must go before the group does:
            # torch aborts at exit ("terminate called without an active exception") when a
            # DistributedDataParallel outlives its process group.
            gc.collect()
            dist.destroy_process_group()


def broadcast_from_rank_zero(value: Any) -> Any:
    """Rank 0's `value` on every rank (a no-op in one process)."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_rank_zero(value: Any) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0; None elsewhere."""
    if not is_distributed():
        return [value]
    out: list[Any] | None = [None] * world_size() if is_rank_zero() else None
    dist.gather_object(value, out, dst=0)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()
