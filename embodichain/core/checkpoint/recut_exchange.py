"""Where the old shards of a re-cut are, and sending their rows to the ranks that cannot read
them (R-ELASTIC-3; the re-cut itself is recut.py).

Every rank states which old shard files it can see, which old shards hold rows it needs,
where its own local shards lie and its node; one exchange (gather, then broadcast) gives
every rank the same view, from which each computes the same plan: an old shard that no rank
can see is refused by name; one that a rank needing it cannot see is sent by the lowest rank
that can (its `sender`, which verifies it) to those ranks (its `recipients`), over the
process group (gloo on CPU, NCCL on CUDA with the tensors on the device), one tensor's rows
at a time. On a shared filesystem every rank sees every shard: nothing is sent.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from embodichain.core.checkpoint.formats import this_node
from embodichain.core.distributed import process_group
from embodichain.core.tensor_bytes import tensor_bytes

Cut = tuple[int, int] | None  # this rank's (first row, rows) of a dim-0-sharded tensor
Key = tuple  # ("model", name) | ("ema", name) | ("opt", index, key)


@dataclass
class Plan:
    """What every rank does with each old shard, the same on every rank."""

    unreachable: list[str] = field(default_factory=list)  # refusals, one per shard
    verify: dict[int, list[int]] = field(default_factory=dict)  # new rank -> old shards
    read: dict[int, list[int]] = field(default_factory=dict)  # new rank -> old shards it maps
    sends: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # old -> (src, dsts)
    cuts: list[Mapping[str, Any]] = field(default_factory=list)  # each new rank's cuts


def gather_view(table: Mapping[int, Mapping[str, Any]], directory: Path, need: set[int],
                cuts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every rank's view (collective, the same exchange on every rank whatever the data):
    the old shard files it sees, the old shards it needs, its cuts and its node."""
    mine = {"here": sorted(k for k, e in table.items() if (directory / e["file"]).is_file()),
            "need": sorted(need), "cuts": cuts, "node": this_node()}
    return process_group.broadcast_from_rank_zero(process_group.gather_to_rank_zero(mine))


def plan(table: Mapping[int, Mapping[str, Any]], directory: Path,
         views: Sequence[Mapping[str, Any]]) -> Plan:
    """Who verifies, reads, sends and receives each old shard, from the manifest's `table`
    and every rank's view alone (so every rank computes the same)."""
    world = len(views)
    nodes = {tuple(v["node"]) for v in views}
    out = Plan(verify={r: [] for r in range(world)}, read={r: [] for r in range(world)},
               cuts=[v["cuts"] for v in views])
    for k, entry in sorted(table.items()):
        holders = [r for r, v in enumerate(views) if k in v["here"]]
        needers = [r for r, v in enumerate(views) if k in v["need"]]
        path, host = directory / entry["file"], entry.get("host")
        if not holders:
            if (host, entry.get("node", 0)) in nodes:
                out.unreachable.append(f"the shard of rank {k} is missing: {path} (written "
                                       f"on host {host})")
            else:
                out.unreachable.append(
                    f"the shard of rank {k} ({path}, written on host {host}) is not reachable "
                    "from any node of this world: put it at that path on one of them (or on "
                    "a shared filesystem)")
            continue
        readers = [r for r in needers if r in holders]
        recipients = [r for r in needers if r not in holders]
        verifiers = set(readers)
        if recipients:
            out.sends[k] = (holders[0], recipients)
            verifiers.add(holders[0])
        if not needers:  # rows nobody needs are still verified, by one rank each
            verifiers.add(k % world if k % world in holders else holders[0])
        for r in verifiers:
            out.verify[r].append(k)
        for r in readers:
            out.read[r].append(k)
    return out


def row_pairs(cuts: Mapping[str, Any], mine: Mapping[str, Any], with_ema: bool
              ) -> list[tuple[Key, list[int], tuple[int, int]]]:
    """(tensor, old cut, new cut) for each tensor of which the old shard with `cuts` holds
    rows that the rank with cuts `mine` holds, in one order that sender and receiver share."""
    pairs: list[tuple[Key, list[int], tuple[int, int]]] = []
    for name, cut in cuts["model"].items():
        if overlap(cut, new := mine["model"][name]) is not None:
            pairs.append((("model", name), cut, new))
            if with_ema:
                pairs.append((("ema", name), cut, new))
    for index, keys in cuts["optimizer"].items():
        new = mine["params"][int(index)]
        for key, cut in keys.items():
            if overlap(cut, new) is not None:
                pairs.append((("opt", index, key), cut, new))
    return pairs


def overlap(cut: Sequence[int] | None, mine: Cut) -> tuple[int, int] | None:
    """The global rows [a, b) that an old cut and a new rank's share both hold, or None."""
    if not cut or mine is None:
        return None
    a, b = max(cut[0], mine[0]), min(cut[0] + cut[1], mine[0] + mine[1])
    return (a, b) if a < b else None


def source(shard: Mapping[str, Any], key: Key) -> torch.Tensor:
    """The old shard's tensor named by `key`."""
    if key[0] == "opt":
        return shard["optimizer"]["state"][key[1]][key[2]]
    return shard[key[0]][key[1]]


def structure(shard: Mapping[str, Any]) -> dict[str, Any]:
    """What a rank takes from old rank 0's shard besides rows (recut._from_rank_zero reads
    it): the shard with each dim-0-sharded tensor replaced by an empty one of its dtype and
    trailing shape, small enough to send whole."""
    def stub(value: torch.Tensor) -> torch.Tensor:
        return torch.empty((0, *value.shape[1:]), dtype=value.dtype)

    rows = {n for n, p in shard["placements"].items() if "offset" in p}
    sharded = {str(i): set(keys) for i, keys in shard["optimizer"]["sharded_keys"].items()}
    optimizer = dict(shard["optimizer"])
    optimizer["state"] = {i: {key: stub(v) if key in sharded.get(str(i), ()) else v
                              for key, v in entry.items()}
                          for i, entry in shard["optimizer"]["state"].items()}

    def tensors(values: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        return None if values is None else {n: stub(v) if n in rows else v
                                            for n, v in values.items()}

    return {"placements": shard["placements"], "model": tensors(shard["model"]),
            "ema": tensors(shard.get("ema")), "optimizer": optimizer,
            "rank_state": shard["rank_state"]}


def comm_device() -> torch.device:
    """Where sent tensors must be: the current CUDA device under NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def send_object(value: Any, dst: int) -> None:
    device = comm_device()
    data = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8).to(device)
    dist.send(torch.tensor([data.numel()], dtype=torch.long, device=device), dst)
    dist.send(data, dst)


def recv_object(src: int) -> Any:
    device = comm_device()
    size = torch.zeros(1, dtype=torch.long, device=device)
    dist.recv(size, src)
    data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.recv(data, src)
    return pickle.loads(tensor_bytes(data))


def send_rows(shard: Mapping[str, Any], pairs: Sequence[tuple[Key, list[int], tuple[int, int]]],
              dtype_of: Callable[[Key], torch.dtype], dst: int) -> None:
    """Send rank `dst` its rows of the mapped old `shard`, one tensor's rows at a time, in
    its own dtype (`dtype_of`: the sender's tensor of that name, the same on every rank)."""
    device = comm_device()
    for key, cut, new in pairs:
        a, b = overlap(cut, new)  # type: ignore[misc]
        rows = source(shard, key)[a - cut[0]:b - cut[0]]
        dist.send(rows.to(device=device, dtype=dtype_of(key)).contiguous(), dst)


def recv_rows(pairs: Sequence[tuple[Key, list[int], tuple[int, int]]],
              target_of: Callable[[Key], torch.Tensor], src: int) -> dict[Key, int]:
    """Receive from `src` the rows of `pairs` into this rank's tensors (`target_of`), in
    place where the tensor is on the backend's device; the rows received per tensor."""
    device, received = comm_device(), {}
    for key, _cut, new in pairs:
        a, b = overlap(_cut, new)  # type: ignore[misc]
        target = target_of(key)[a - new[0]:b - new[0]]
        if target.device == device and target.is_contiguous():
            dist.recv(target, src)
        else:
            buffer = torch.empty(target.shape, dtype=target.dtype, device=device)
            dist.recv(buffer, src)
            target.copy_(buffer)
        received[key] = b - a
    return received


def own_shards(table: Mapping[int, Mapping[str, Any]], directory: Path,
               read: Callable[[int], Any]) -> tuple[Any, str | None]:
    """On the same world size: this rank's own old shard (`read(k)` reads and verifies old
    shard k here), or what is wrong with it. A rank whose node does not see its shard
    receives it whole from the lowest rank that does, which reads and verifies it (a node
    replaced by an empty one; shards gathered on another node). Collective: one exchange,
    then the sends in shard order, the same plan on every rank."""
    from embodichain.core.errors import CheckpointError

    def attempt(k: int) -> tuple[Any, str | None]:
        try:
            return read(k), None
        except CheckpointError as exc:
            return None, str(exc)

    rank = process_group.rank()
    here = sorted(k for k, e in table.items() if (directory / e["file"]).is_file())
    views = process_group.broadcast_from_rank_zero(process_group.gather_to_rank_zero(here))
    mine: tuple[Any, str | None] = (None, None)
    for k in range(len(views)):
        holders = [r for r, seen in enumerate(views) if k in seen]
        if k in views[k] or not holders:  # read where it lies (or refused there by name)
            if rank == k:
                mine = attempt(k)
        elif rank == holders[0]:
            send_object(attempt(k), k)
        elif rank == k:
            mine = recv_object(holders[0])
    return mine
