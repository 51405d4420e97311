"""Re-cutting a sharded checkpoint for another world size (R-ELASTIC-3, the FSDP side).

Each shard's line in the manifest records where its rows of every dim-0-sharded tensor lie
(`cuts`: offset, length and global rows, as FSDP2 cut them: uneven or empty chunks are read
off the DTensors at save, never guessed) and the sha256 of its file. A rank of a world of
another size then, with no rank ever holding the full state:

1. plans from the manifest alone which old shards hold rows of its own local shards (old
   rank 0's always: its replicated values are taken, i.e. buffers, the optimizer's step
   counts and that rank's own state);
2. learns, in one exchange, which old shard files every rank sees (recut_exchange.py): an
   old shard that a rank needing it does not see is sent to it by the lowest rank that
   does; one that no rank sees is refused by name (its file and host);
3. verifies, streaming over the file (nothing loaded), every old shard it will read or
   send, and the old shards that no rank reads that fall to it (old rank k: new rank k mod
   world size, or the lowest that sees it), so every old shard is verified, and checks that
   each belongs to this checkpoint; all ranks learn every problem and refuse alike before
   anything is loaded, naming each missing, unreachable or damaged shard with its file and
   host;
4. takes the old shards in turn: a rank that reads one memory-maps it
   (`torch.load(mmap=True)`) and copies only the rows that overlap its own local shards of
   the model, the optimizer state and the EMA; its sender maps it and sends each receiving
   rank only those rows, one tensor at a time (and old rank 0's replicated values whole).

Its peak memory is its own share plus the mapped pages it reads of one old shard (a sender:
plus one tensor's rows in flight). On a shared filesystem every rank sees every old shard and
nothing is sent. The collectives are the same on every rank whatever the data (two
exchanges); the sends follow from the manifest and the exchange, the same plan on every
rank, so every send meets its receive.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint import recut_exchange as exchange
from embodichain.core.checkpoint.sharded import (
    SHARD_DIRECTORY,
    as_param_shard,
    payload_shards,
    shard_cuts,
)
from embodichain.core.checkpoint.tensor_names import refuse_other_tensors
from embodichain.core.distributed import process_group
from embodichain.core.distributed.sharding import dim0_cut, local
from embodichain.core.errors import CheckpointCorruptError, CheckpointError
from embodichain.core.file_hash import file_sha256

RUN_KEYS = ("step", "run_id", "world_size", "config_sha256")


def recut_refusal(payload: Mapping[str, Any]) -> str | None:
    """Why the sharded checkpoint `payload` cannot be re-cut for another world size (one
    line), or None when it can."""
    table = payload_shards(payload)
    old = [r for r, e in sorted(table.items()) if "cuts" not in e or "file_sha256" not in e]
    if old:
        return (f"its manifest does not record where each shard's rows lie (shards of rank(s) "
                f"{', '.join(map(str, old))}: written by an earlier embodichain), so its shards "
                f"cannot be re-cut; it can continue only on {len(table)} rank(s)")
    names = table[0]["cuts"]["model"]
    for rank, entry in table.items():
        if entry["cuts"]["model"].keys() != names.keys():
            return f"the shards of ranks 0 and {rank} hold different tensors"
    for name, cut in names.items():
        if cut == "other":
            return f"{name} is not sharded by rows (dim 0); only dim-0 shards can be re-cut"
        if cut is not None and not _tiles([table[r]["cuts"]["model"][name] for r in table]):
            return f"the recorded rows of {name} do not tile it"
    for index, keys in table[0]["cuts"]["optimizer"].items():
        for key in keys:
            cuts = [table[r]["cuts"]["optimizer"].get(index, {}).get(key) for r in table]
            if None in cuts or not _tiles(cuts):
                return f"the recorded rows of the optimizer's {key} of tensor {index} do not " \
                       "tile it"
    return None


def _tiles(cuts: list[list[int]]) -> bool:
    """Whether the non-empty [offset, length, rows] cuts, in rank order, cover 0..rows."""
    total, position = cuts[0][2], 0
    for offset, length, rows in cuts:
        if rows != total or length < 0:
            return False
        if length:
            if offset != position:
                return False
            position += length
    return position == total


def restore_recut(model: nn.Module, optimizer: torch.optim.Optimizer, ema: Any,
                  payload: Mapping[str, Any]) -> dict[str, Any]:
    """Load this rank's share of the sharded checkpoint `payload`, written by another world
    size, into the sharded `model`, its `optimizer` and its `ema` (a ShardedEma or None);
    old rank 0's own state (collective: every rank calls it)."""
    directory = Path(payload["sharded"][SHARD_DIRECTORY])
    world, rank = process_group.world_size(), process_group.rank()
    where = f"the sharded checkpoint in {directory} ({len(payload_shards(payload))} rank(s))"
    refusal = recut_refusal(payload)  # the same payload on every rank: all refuse alike
    if refusal is None and ema is not None and not payload_shards(payload)[0]["cuts"]["ema"]:
        refusal = "it holds no EMA weights (trained without trainer.ema)"
    if refusal is not None:
        raise CheckpointError(f"cannot continue {where} on {world} rank(s): {refusal}")
    table = payload_shards(payload)
    own = model.state_dict()
    refuse_other_tensors(own, table[0]["cuts"]["model"], where)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    mine = {"model": {n: _own_cut(v) for n, v in own.items()},
            "params": [_own_cut(p) for p in params]}
    views = exchange.gather_view(table, directory, _needed(table, mine), mine)
    plan = exchange.plan(table, directory, views)
    problems = [p for k in plan.verify[rank]
                if (p := _check_file(directory, k, table[k], payload)) is not None]
    everyone = process_group.broadcast_from_rank_zero(process_group.gather_to_rank_zero(problems))
    unique = list(dict.fromkeys([*plan.unreachable, *(p for found in everyone for p in found)]))
    if unique:
        raise CheckpointError(f"cannot continue {where} on {world} rank(s): "
                              + "; ".join(unique) + ". Nothing was loaded.")
    return _load(directory, table, plan, own, params, model, optimizer, ema)


def _needed(table: Mapping[int, Mapping[str, Any]], mine: Mapping[str, Any]) -> set[int]:
    """The old ranks whose shards hold rows of this rank's local shards (and old rank 0)."""
    need = {0}
    for k, entry in table.items():
        if exchange.row_pairs(entry["cuts"], mine, with_ema=False):
            need.add(k)
    return need


def _own_cut(value: Any) -> tuple[int, int] | None:
    cut = dim0_cut(value) if value.dim() > 0 and hasattr(value, "device_mesh") else None
    return (cut["offset"], cut["length"]) if cut else None


def _check_file(directory: Path, rank: int, entry: Mapping[str, Any],
                payload: Mapping[str, Any]) -> str | None:
    """None when old rank `rank`'s shard file, seen here, has the bytes the manifest
    recorded and belongs to its checkpoint."""
    path, host = directory / entry["file"], entry.get("host")
    if not path.is_file():  # seen by the exchange a moment ago
        return f"the shard of rank {rank} is missing: {path} (written on host {host})"
    if file_sha256(path) != entry["file_sha256"]:
        return (f"the shard of rank {rank} ({path}, written on host {host}) is corrupt: its "
                "bytes do not match the manifest's digest of it")
    try:
        _check_identity(_mapped(path), payload, rank, entry, path)
    except CheckpointError as exc:
        return str(exc)
    return None


def _mapped(path: Path) -> dict[str, Any]:
    """A shard file's dict with its tensors memory-mapped (pages read only when touched)."""
    return torch.load(path, mmap=True, weights_only=True, map_location="cpu")["payload"]


def _load(directory: Path, table: Mapping[int, Mapping[str, Any]], plan: exchange.Plan,
          own: Mapping[str, Any], params: list[torch.Tensor], model: nn.Module,
          optimizer: torch.optim.Optimizer, ema: Any) -> dict[str, Any]:
    """Every old shard in turn (old rank 0's first: the structure and the replicated
    values), each mapped by the ranks that read it and sent by its sender to the rest:
    at most one old shard mapped at a time."""
    rank = process_group.rank()
    ema_state = ema.state_dict() if ema is not None else None  # its live local tensors
    names = [{id(p): n for n, p in model.named_parameters()}.get(id(p), "") for p in params]
    opt: dict[str, Any] = {}
    copied: dict[tuple, int] = {}

    def target(key: tuple) -> torch.Tensor:
        if key[0] == "model":
            return local(own[key[1]])
        return ema_state[key[1]] if key[0] == "ema" else opt["state"][int(key[1])][key[2]]

    def count(rows: Mapping[tuple, int]) -> None:
        for key, n in rows.items():
            key = ("opt", int(key[1]), key[2]) if key[0] == "opt" else key
            copied[key] = copied.get(key, 0) + n

    for k in sorted(set(plan.read[rank]) | set(plan.sends)):
        cuts = table[k]["cuts"]
        src, dsts = plan.sends.get(k, (None, []))
        shard = None
        if k in plan.read[rank] or src == rank:
            shard = _mapped(directory / table[k]["file"])
        if k in plan.read[rank]:
            if k == 0:
                opt = _from_rank_zero(shard, own, ema_state, params, names,
                                      directory / table[k]["file"])
            count(_copy_rows(shard, exchange.row_pairs(cuts, plan.cuts[rank],
                                                       ema_state is not None), target))
        with torch.no_grad():
            if src == rank:
                for dst in dsts:
                    if k == 0:
                        exchange.send_object(exchange.structure(shard), dst)
                    exchange.send_rows(shard, exchange.row_pairs(
                        cuts, plan.cuts[dst], ema_state is not None),
                        lambda key: target(key).dtype, dst)
            elif rank in dsts:
                if k == 0:
                    opt = _from_rank_zero(exchange.recv_object(src), own, ema_state, params,
                                          names, directory / table[k]["file"])
                count(exchange.recv_rows(exchange.row_pairs(cuts, plan.cuts[rank],
                                                            ema_state is not None),
                                         target, src))
        del shard  # unmapped before the next one is mapped
    for key, rows in _expected(own, ema_state, opt, params).items():
        if copied.get(key, 0) != rows:
            raise CheckpointCorruptError(f"{directory}: the old shards gave "
                                         f"{copied.get(key, 0)} of the {rows} rows of {key} "
                                         "on this rank")
    state = {i: {key: as_param_shard(v, params[i]) if key in opt["sharded"].get(i, ()) else v
                 for key, v in entry.items()} for i, entry in opt["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": opt["param_groups"]})
    return opt["rank_state"]


def _check_identity(shard: Mapping[str, Any], payload: Mapping[str, Any], rank: int,
                    entry: Mapping[str, Any], path: Path) -> None:
    mine, run = shard["run"], payload["run"]
    for key in RUN_KEYS:
        if mine.get(key) != run.get(key):
            raise CheckpointCorruptError(f"shard of rank {rank} ({path}) belongs to another "
                                         f"checkpoint: {key} {mine.get(key)!r}, manifest "
                                         f"{run.get(key)!r}")
    if mine.get("rank") != rank or shard_cuts(shard) != entry["cuts"]:
        raise CheckpointCorruptError(f"{path} is not the shard the manifest recorded for "
                                     f"rank {rank}")


def _from_rank_zero(shard: Mapping[str, Any], own: Mapping[str, Any], ema_state: Any,
                    params: list[torch.Tensor], param_names: list[str], path: Path
                    ) -> dict[str, Any]:
    """From old rank 0: shapes checked, replicated tensors copied (buffers, the EMA's), the
    optimizer's state allocated at this rank's size with its replicated values, and that
    rank's own state; all copied out of the mapping."""
    for name, placement in shard["placements"].items():
        if tuple(placement["global_shape"]) != tuple(own[name].shape):
            raise CheckpointError(f"{name}: the model's is {tuple(own[name].shape)}, the "
                                  f"checkpoint's {tuple(placement['global_shape'])} ({path})")
    with torch.no_grad():
        for name, placement in shard["placements"].items():
            if "offset" not in placement:
                local(own[name]).copy_(shard["model"][name])
                if ema_state is not None:
                    ema_state[name].copy_(shard["ema"][name])
    saved = shard["optimizer"]
    if list(saved["param_names"]) != param_names:
        raise CheckpointError(f"the optimizer's tensors differ from the checkpoint's ({path}): "
                              f"{param_names[:5]} against {list(saved['param_names'])[:5]}")
    sharded = {int(i): set(keys) for i, keys in saved["sharded_keys"].items()}
    state: dict[int, dict[str, Any]] = {}
    for index, entry in saved["state"].items():
        param = local(params[int(index)])
        state[int(index)] = {
            key: torch.empty((param.shape[0], *value.shape[1:]), dtype=value.dtype,
                             device=param.device)
            if key in sharded.get(int(index), ()) else _owned(value)
            for key, value in entry.items()}
    return {"state": state, "sharded": sharded, "param_groups": _owned(saved["param_groups"]),
            "rank_state": _owned(shard["rank_state"])}


def _copy_rows(shard: Mapping[str, Any], pairs: list, target: Any) -> dict[tuple, int]:
    """Copy this rank's rows (`pairs`, exchange.row_pairs) out of the mapped old `shard`."""
    copied: dict[tuple, int] = {}
    with torch.no_grad():
        for key, cut, mine in pairs:
            a, b = exchange.overlap(cut, mine)
            target(key)[a - mine[0]:b - mine[0]].copy_(
                exchange.source(shard, key)[a - cut[0]:b - cut[0]])
            copied[key] = b - a
    return copied


def _expected(own: Mapping[str, Any], ema_state: Any, opt: Mapping[str, Any],
              params: list[torch.Tensor]) -> dict[tuple, int]:
    """The rows each of this rank's local shards must have received."""
    rows = {("model", n): cut[1] for n, v in own.items() if (cut := _own_cut(v))}
    if ema_state is not None:
        rows |= {("ema", n): count for (_, n), count in list(rows.items())}
    for index, keys in opt["sharded"].items():
        rows |= {("opt", index, key): local(params[index]).shape[0] for key in keys}
    return rows


def _owned(value: Any) -> Any:
    """`value` with every tensor copied out of the mapped file (nothing keeps it mapped)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _owned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_owned(v) for v in value)
    return value
