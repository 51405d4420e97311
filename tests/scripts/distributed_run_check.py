"""Process-group lifetime under torchrun (R-DIST-1), written for tests/test_distributed_run.py.

    torchrun --nproc-per-node=2 -m distributed_run_check OUT          # gloo, CPU
    torchrun --nproc-per-node=N -m distributed_run_check OUT cuda     # NCCL, N GPUs

Each rank records what it observed, scenario by scenario, in `OUT/rank{R}.json`; the test
asserts on the records. Nothing here is mocked: the groups are real gloo groups.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from embodichain.learning.sl import distributed_run

AGENT_STORE: list[str] = []  # torchrun's store (MASTER_ADDR, MASTER_PORT as launched)


class Boom(Exception):
    pass


def all_reduce_sum(value: float) -> float:
    t = torch.tensor([value])
    dist.all_reduce(t)
    return t.item()


def fresh_rendezvous(scenario: int) -> None:
    """Point env:// at a new store before the next group is created.

    torch names every default group "0" and re-uses the keys of the store torchrun's agent
    hosts, so a second group in one process can read the peer's stale address from the
    previous group and fail to connect. A separate launch per scenario would avoid that, at
    seconds each; instead rank 0 hosts a fresh store on a free port (as env:// does when
    there is no agent store) and publishes the port in the agent's store under a new key.
    """
    agent = dist.TCPStore(AGENT_STORE[0], int(AGENT_STORE[1]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    key = f"distributed_run_check/port/{scenario}"
    if int(os.environ["RANK"]) == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        agent.set(key, str(port))
    os.environ["MASTER_PORT"] = agent.get(key).decode()
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "False"


def inside(device: torch.device) -> dict:
    return {
        "initialized": dist.is_initialized(),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "world_size": dist.get_world_size() if dist.is_initialized() else None,
        "rank": dist.get_rank() if dist.is_initialized() else None,
        "device": str(device),
        "sum": all_reduce_sum(dist.get_rank() + 1.0) if dist.is_initialized() else None,
    }


def main_cuda(out: Path) -> None:
    """CUDA: NCCL and `cuda:LOCAL_RANK`, for a machine with GPUs."""
    rank = int(os.environ["RANK"])
    with distributed_run("cuda") as device:
        t = torch.ones(1, device=device) * (rank + 1)
        dist.all_reduce(t)
        seen = {"backend": dist.get_backend(), "device": str(device),
                "current_device": torch.cuda.current_device(), "sum": t.item(),
                "local_rank": int(os.environ["LOCAL_RANK"])}
    seen["after"] = dist.is_initialized()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(seen, indent=1))


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    AGENT_STORE[:] = [os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]]
    seen: dict = {"before": dist.is_initialized()}

    # 1. No group yet: distributed_run creates one and destroys it on exit.
    with distributed_run("cpu") as device:
        seen["own"] = inside(device)
    seen["own"]["after"] = dist.is_initialized()

    # 2. An exception inside: it propagates unchanged and the group is still destroyed.
    record: dict = {}
    fresh_rendezvous(2)
    try:
        with distributed_run("cpu") as device:
            record.update(inside(device))
            raise Boom("from inside the block")
    except Boom as exc:
        record["propagated"] = str(exc)
    record["after"] = dist.is_initialized()
    seen["exception"] = record

    # 3. `auto` on a machine without CUDA resolves to the CPU (and gloo).
    fresh_rendezvous(3)
    with distributed_run("auto") as device:
        seen["auto"] = inside(device)
    seen["auto"]["after"] = dist.is_initialized()

    # 4. A group the caller created stays the caller's: untouched, normal exit or not.
    fresh_rendezvous(4)
    dist.init_process_group("gloo")
    world = dist.group.WORLD
    with distributed_run("cpu") as device:
        seen["preexisting"] = inside(device)
        seen["preexisting"]["same_group"] = dist.group.WORLD is world
    seen["preexisting"]["after"] = dist.is_initialized()
    seen["preexisting"]["usable_after"] = all_reduce_sum(1.0)
    try:
        with distributed_run("cpu"):
            raise Boom("caller's group")
    except Boom:
        pass
    seen["preexisting"]["after_exception"] = dist.is_initialized()
    seen["preexisting"]["usable_after_exception"] = all_reduce_sum(1.0)
    dist.destroy_process_group()

    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(seen, indent=1))


if __name__ == "__main__":
    (main_cuda if sys.argv[2:] == ["cuda"] else main)(Path(sys.argv[1]))
