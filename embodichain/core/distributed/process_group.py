"""Process-group lifetime and the few collectives the framework uses (R-DIST-1, R-DIST-5)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import pickle
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from embodichain.core.distributed.stop_request import (
    RANK_ZERO_GRACE_S,
    TRAINING_GRACE_S,
    blocking_wait,
    ignore_sigterm,
    sigterm_given_back,
)
from embodichain.core.errors import TrainingError, UsageError
from embodichain.core.tensor_bytes import tensor_bytes


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
    the caller's. In a single process no group is created. Yields the resolved device. A
    run that failed or was refused inside it leaves SIGTERM as it found it (but in the CLI,
    whose process then exits: `wait_for_rank_zero_exit`).
    """
    with sigterm_given_back():
        with _distributed_run(device) as resolved:
            yield resolved


@contextlib.contextmanager
def _distributed_run(device: str | torch.device) -> Iterator[torch.device]:
    resolved = resolve_device(device)
    owns_group = False
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not is_distributed():
        _import_what_would_hold_the_group()
        with blocking_wait("the other workers to join"):  # a SIGTERM here ends it (R-PROC-3)
            store, group_rank, size = _attempt_store(consume=True)
            if resolved.type == "cuda":
                torch.cuda.set_device(resolved)
                dist.init_process_group("nccl", device_id=resolved, store=store,
                                        rank=group_rank, world_size=size)
            else:
                dist.init_process_group("gloo", store=store, rank=group_rank, world_size=size)
        owns_group = True
        _word_between_ranks(store)
    elif resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    try:
        yield resolved
    finally:
        if owns_group:
            _word_between_ranks(None)
            # Objects that hold the group (DDP reducers) must go before the group does:
            # torch aborts at exit ("terminate called without an active exception") when a
            # DistributedDataParallel outlives its process group.
            gc.collect()
            dist.destroy_process_group()


# The group's store, where a failing rank leaves its message for the others (no collective):
# a key of its own per group this process made, so a later group reads no stale word.
_WORD: dict[str, Any] = {"store": None, "groups": 0}


def _word_between_ranks(store: dist.Store | None) -> None:
    if store is not None:
        _WORD["groups"] += 1
    _WORD["store"] = store


def _failure_key(rank: int) -> str:
    return f"embodichain/group_{_WORD['groups']}/failure/rank_{rank}"


def group_store() -> tuple[dist.Store | None, str]:
    """The group's store and a key prefix of this group's own (None in one process or in a
    group that a program made itself): for words between ranks outside the collectives."""
    return _WORD["store"], f"embodichain/group_{_WORD['groups']}/"


def leave_failure(message: str) -> None:
    """Leave this rank's failure where every rank can read it without a collective (the
    group's store), before this rank stops: a peer that then loses its connection to it
    reports this message, the cause, instead of its lost connection (R-STRAT-2). A no-op
    in one process or in a group that a program made itself."""
    store = _WORD["store"]
    if store is None:
        return
    with contextlib.suppress(Exception):  # the launcher's store gone: nothing to tell
        store.set(_failure_key(rank()), message)


def failure_left_by_peers(wait_s: float = 0.0) -> str | None:
    """The failure another rank left with `leave_failure` (the lowest such rank's), waiting
    up to `wait_s` for one; None when none did. A rank leaves its word before it stops, so
    a peer that sees the connection to it close finds the word already there."""
    store = _WORD["store"]
    if store is None:
        return None
    deadline = time.monotonic() + wait_s
    peers = [_failure_key(r) for r in range(world_size()) if r != rank()]
    with contextlib.suppress(Exception):
        while True:
            for key in peers:
                if store.check([key]):
                    return store.get(key).decode(errors="replace")
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
    return None


def _import_what_would_hold_the_group() -> None:
    """Import, before the group exists, the torch module that would otherwise keep it alive.

    `torch.distributed.nn.functional` binds `group=group.WORLD` as default arguments when it
    is imported. torch imports it lazily (the first optimizer step of torch.optim reaches
    torch._dynamo, which imports FSDP and `_shard`), so, imported after init_process_group,
    ten function defaults hold the group for the process's life: destroy_process_group then
    frees nothing, and gloo's threads (two run loops, the TCP event loop) run on into
    interpreter exit, where they race the peers' closing sockets and the C++ teardown: the
    occasional SIGABRT ("terminate called without an active exception") of a finished run
    on a busy machine (R-PROC-2). Imported first, the defaults are None ("the default group
    at call time") and the group is freed when it is destroyed.
    """
    import torch.distributed.nn.functional  # noqa: F401


def gloo_threads() -> list[str]:
    """The names of this process's gloo threads (Linux; [] elsewhere): none may be left once
    the group is destroyed."""
    names = []
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
                if "gloo" in name:
                    names.append(name)
    return names


def _attempt_store(consume: bool = False) -> tuple[dist.Store, int, int]:
    """torchrun's store (env://), with keys private to this restart attempt.

    Under `--max-restarts`, the workers of a restart can find the agent store still holding
    the previous attempt's keys (the gloo addresses of dead workers), and fail to connect;
    a prefix per attempt keeps every attempt's rendezvous its own.
    """
    global _STORE
    if _STORE is None:  # the exchange before the group and the group share one client
        store, group_rank, size = next(dist.rendezvous("env://"))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        _STORE = dist.PrefixStore(f"embodichain/attempt_{attempt}", store), group_rank, size
    found = _STORE
    if consume:  # a later group (another distributed_run) makes a rendezvous of its own
        _STORE = None
    return found


_STORE: tuple[dist.Store, int, int] | None = None


def from_rank_zero_before_group(key: str, produce: Callable[[], Any]) -> Any:
    """`produce()` run on global rank 0 only, its JSON-able result given to every rank.

    For what rank 0 alone can read before the process group exists (a run directory's
    stored recipe: other nodes may not have the directory, R-DIST-6). A UsageError there
    reaches every rank, which exit with its code while rank 0 prints it once.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return produce()
    store = _attempt_store()[0]
    if env_rank() == 0:
        try:
            value = produce()
        except UsageError as exc:
            store.set(key, json.dumps({"refused": str(exc), "exit_code": exc.exit_code,
                                       **rank_zero_origin()}))
            raise
        store.set(key, json.dumps({"value": value}))
        return value
    answer = json.loads(store.get(key))
    if "refused" in answer:
        _wait_for_exit(answer)
        error = UsageError(answer["refused"])
        error.exit_code = answer["exit_code"]
        raise error
    return answer["value"]


# Object collectives of our own: torch's (broadcast_object_list, gather_object, ...) turn
# bytes back into objects with Tensor.numpy(), and NumPy need not be importable. Objects travel
# as pickled uint8 tensors, on the device the backend needs (CUDA for NCCL).


def _object_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _encode(value: Any, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)


def _decode(data: torch.Tensor, size: int) -> Any:
    return pickle.loads(tensor_bytes(data[:size]))


def _sizes(sizes: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.long, device=device)


def broadcast_from_rank_zero(value: Any) -> Any:
    """Rank 0's `value` on every rank (a no-op in one process)."""
    if not is_distributed():
        return value
    device = _object_device()
    data = _encode(value, device) if is_rank_zero() else None
    size = _sizes([data.numel() if data is not None else 0], device)
    dist.broadcast(size, src=0)
    if data is None:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return value if is_rank_zero() else _decode(data, int(size.item()))


def scatter_from_rank_zero(values: list[Any] | None) -> Any:
    """`values[r]` (given on rank 0) on each rank r: every rank receives only its own."""
    if not is_distributed():
        assert values is not None
        return values[0]
    device = _object_device()
    parts = [_encode(v, device) for v in values] if is_rank_zero() and values else None
    sizes = _sizes([p.numel() for p in parts] if parts else [0] * world_size(), device)
    dist.broadcast(sizes, src=0)
    longest = int(sizes.max().item())
    mine = torch.empty(longest, dtype=torch.uint8, device=device)
    padded = ([torch.nn.functional.pad(p, (0, longest - p.numel())) for p in parts]
              if parts else None)
    dist.scatter(mine, padded, src=0)
    return _decode(mine, int(sizes[rank()].item()))


def gather_to_rank_zero(value: Any) -> list[Any] | None:
    """Every rank's `value`, in rank order, on rank 0; None elsewhere."""
    if not is_distributed():
        return [value]
    device = _object_device()
    data = _encode(value, device)
    sizes = [_sizes([0], device) for _ in range(world_size())]
    dist.all_gather(sizes, _sizes([data.numel()], device))
    longest = max(int(s.item()) for s in sizes)
    padded = torch.nn.functional.pad(data, (0, longest - data.numel()))
    out = ([torch.empty(longest, dtype=torch.uint8, device=device) for _ in sizes]
           if is_rank_zero() else None)
    dist.gather(padded, out, dst=0)
    if out is None:
        return None
    return [_decode(t, int(s.item())) for t, s in zip(out, sizes, strict=True)]


def sum_over_ranks(values: list[int]) -> list[int]:
    """The element-wise sum of every rank's `values` (the same length on every rank), on
    every rank; the values themselves in one process."""
    if not is_distributed():
        return list(values)
    data = torch.tensor(values, dtype=torch.long, device=_object_device())
    dist.all_reduce(data)
    return [int(v) for v in data.tolist()]


def waiting_for_others(what: str, on_rank_zero: bool = False
                       ) -> contextlib.AbstractContextManager[None]:
    """Mark a wait in training for `what` (e.g. "the other ranks in update 7"; `on_rank_zero`:
    for rank 0's validation or save): a rank that no longer answers must not hold the others
    past a stop signal (R-PROC-3). A no-op in one process, where nobody is waited for."""
    if not is_distributed():
        return contextlib.nullcontext()
    return blocking_wait(what, RANK_ZERO_GRACE_S if on_rank_zero else TRAINING_GRACE_S,
                         "the updates after the last snapshot are lost, and resuming does "
                         "them again")


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def rank_zero_origin() -> dict[str, Any]:
    """Where rank 0 runs, sent with a failure or refusal so that others can wait for it."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


def raise_if_rank_zero_failed(failure: str | None, what: str, waiting_for: str,
                              **shared: Any) -> dict[str, Any]:
    """Every rank learns whether rank 0 failed (validating, saving); if so every rank raises
    TrainingError with rank 0's `what` (only rank 0 may know which file failed), so none
    hangs. `shared`: rank 0's values that ride along, returned in the outcome."""
    mine = {"failure": failure, "what": what, **rank_zero_origin(), **shared}
    with waiting_for_others(waiting_for, on_rank_zero=True):
        outcome = broadcast_from_rank_zero(mine if is_rank_zero() else None)
    if outcome["failure"]:
        wait_for_rank_zero_exit(outcome)
        raise TrainingError(f"{outcome['what']}: {outcome['failure']}")
    return outcome


def wait_for_rank_zero_exit(origin: Mapping[str, Any], timeout: float = 10.0) -> None:
    """Called by every rank when rank 0 stops the run (refusal or failure), before raising.

    Guarantee (design §9): each worker ends with the run's own exit code (2 for a refusal, 1
    for a failure), also on a loaded machine, and rank 0 prints the reason. torchrun stops
    the remaining workers with SIGTERM as soon as the first one exits, so from here until
    it exits every rank ignores SIGTERM: a rank still shutting down when torchrun reacts
    ends with its own code instead of -15 (torchrun escalates to SIGKILL only after 30 s).
    (A program that called `train()` gets its SIGTERM handler back when the run's
    `distributed_run` ends; the CLI's process keeps ignoring it until it exits.)
    A barrier makes sure every rank has done so before any of them can exit. Then the other
    ranks leave only after rank 0 has ended, so that rank 0 is never stopped before it has
    printed the reason. Only ranks on rank 0's host can see its process; others go at once.
    """
    ignore_sigterm()
    barrier()
    if not is_rank_zero():
        _wait_for_exit(origin, timeout)


def _wait_for_exit(origin: Mapping[str, Any], timeout: float = 10.0) -> None:
    """Ignore torchrun's SIGTERM from now on, and let rank 0 (if on this host: others cannot
    see its process) exit first, so that it prints the reason and every rank ends with the
    run's own code."""
    ignore_sigterm()
    if origin.get("host") != socket.gethostname():
        return
    pid = origin.get("pid")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and isinstance(pid, int) and _process_alive(pid):
        time.sleep(0.02)


def _process_alive(pid: int) -> bool:
    """Whether `pid` runs (an exited process that is not yet reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
