"""Sharded checkpoints (`trainer.strategy: fsdp`, R-SHARD-2..4): one shard file per rank, and
a manifest naming every shard with its digest, published last.

Layout in the run directory (`step_N.pt`, `last.pt`, `best.pt` are manifests):

    step_40.pt                         manifest: run identity, config, schedule, callbacks,
                                       and the shard table {rank: file, sha256, bytes, host}
    shards/step_40.<token>.rank_0.pt   rank 0's shard: its local shards of the model,
    shards/step_40.<token>.rank_1.pt   optimizer and EMA, placement metadata, its RNG
                                       streams, sampler and buffers

Both kinds are ordinary embodichain checkpoint files (file.py): a `torch.save` dict with a
manifest and a payload digest recomputed on load, written atomically, always loaded with
`weights_only=True`. The manifest is written only once every rank's shard is durable, so a
SIGKILL at any moment leaves each published checkpoint complete: a shard without a manifest
is never read, and is deleted by the next save of its rank. The token makes every save's
shard names unique, so no save ever replaces a file that a published manifest names.

Why not torch's distributed checkpoint (DCP): its metadata file is unpickled without
`weights_only` (loading could run code from the file), it has no digests, and it writes a
value saved under one key by all ranks only once (per-rank RNG and sampler state would need
keys by rank). A shard here holds only local tensors and plain values; consolidating one
into a full `state_dict` (export) concatenates the dim-0 shards in rank order.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint
from embodichain.core.checkpoint.tensor_names import refuse_other_tensors
from embodichain.core.distributed.sharding import dim0_cut, local
from embodichain.core.errors import CheckpointCorruptError, CheckpointError

STRATEGY = "fsdp"
SHARDS_DIR = "shards"
SHARD_DIRECTORY = "directory"  # set on load: where this manifest's shards are (its folder)


def shard_relpath(step: int, token: str, rank: int) -> str:
    """A shard's path relative to the run directory (unique per save by `token`)."""
    return f"{SHARDS_DIR}/step_{step}.{token}.rank_{rank}.pt"


def is_sharded_checkpoint(data: Mapping[str, Any]) -> bool:
    """Whether a verified checkpoint dict is a sharded manifest (as shard_format's
    `Sharded.holds`, which must not import this module's torch)."""
    return isinstance(data.get("payload"), Mapping) and "sharded" in data["payload"]


def payload_to_restore(data: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """A verified checkpoint's payload to restore; a sharded one also says where its shards
    are: the manifest's directory as the command named it (not resolved), so that each
    node reads its own copy of it, as each resolves a relative `trainer.output_dir`."""
    payload = data["payload"]
    if not is_sharded_checkpoint(data):
        return payload
    return {**payload, "sharded": {**payload["sharded"],
                                   SHARD_DIRECTORY: str(Path(path).parent)}}


# ----------------------------------------------------------------------------------------
# A rank's shard: capture and restore


def shard_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                ema: Mapping[str, torch.Tensor] | None, rank_state: Mapping[str, Any]
                ) -> dict[str, Any]:
    """This rank's part of the training state (live tensors: stage a copy before writing).

    `model` is FSDP2-sharded: its state_dict holds DTensors, of which the local shard is
    kept with the global shape. Optimizer state mirrors the parameters' sharding.
    """
    model_state, placements = {}, {}
    for name, value in model.state_dict().items():
        model_state[name] = local(value)
        placements[name] = _placement(value)
    optim = optimizer.state_dict()
    sharded_keys: dict[int, list[str]] = {}
    state: dict[int, dict[str, Any]] = {}
    offsets: dict[int, dict[str, list[int]]] = {}
    for index, entry in optim["state"].items():
        state[index] = {}
        for key, value in entry.items():
            if _is_dtensor(value):
                sharded_keys.setdefault(index, []).append(key)
                cut = _placement(value)
                if "offset" in cut:
                    offsets.setdefault(index, {})[key] = _cut(cut)
            state[index][key] = local(value) if isinstance(value, torch.Tensor) else value
    names = {id(p): n for n, p in model.named_parameters()}
    return {
        "model": model_state,
        "placements": placements,
        "optimizer": {"state": state, "param_groups": optim["param_groups"],
                      "sharded_keys": sharded_keys,
                      # index -> key -> [dim-0 offset, length, global rows], as for the model
                      "offsets": offsets,
                      # optimizer index -> parameter name, for readers (inspect)
                      "param_names": [names.get(id(p), "") for g in optimizer.param_groups
                                      for p in g["params"]]},
        "ema": dict(ema) if ema is not None else None,
        "rank_state": dict(rank_state),
    }


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _placement(value: Any) -> dict[str, Any]:
    if not _is_dtensor(value):
        return {"kind": "replicated", "global_shape": list(value.shape)}
    from torch.distributed.tensor import Shard

    dim0 = len(value.placements) == 1 and isinstance(value.placements[0], Shard) \
        and value.placements[0].dim == 0
    placement = {"kind": "shard0" if dim0 else "other",
                 "placements": [repr(p) for p in value.placements],
                 "global_shape": list(value.shape)}
    if dim0 and value.dim() > 0:
        placement.update(dim0_cut(value))
    return placement


def _cut(placement: Mapping[str, Any]) -> list[int]:
    return [placement["offset"], placement["length"], placement["global_shape"][0]]


def shard_cuts(state: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's record of where a shard's rows lie (what a re-cut on another world
    size plans from, without opening the shard): model tensor -> [offset, length, global
    rows] (None: replicated; "other": sharded otherwise), optimizer index -> key -> the
    same, and whether the shard holds an EMA (sharded like the model)."""
    model = {name: (_cut(p) if "offset" in p else None if p["kind"] == "replicated"
                    else "other") for name, p in state["placements"].items()}
    return {"model": model, "optimizer": state["optimizer"].get("offsets", {}),
            "ema": state.get("ema") is not None}


def restore_shard(model: nn.Module, optimizer: torch.optim.Optimizer,
                  shard: Mapping[str, Any]) -> None:
    """Load this rank's saved local shards into the sharded model and its optimizer."""
    saved = shard["model"]
    own = model.state_dict()
    refuse_other_tensors(own, saved, "the checkpoint")
    with torch.no_grad():
        for name, value in own.items():
            target = local(value)
            if tuple(target.shape) != tuple(saved[name].shape):
                raise CheckpointError(f"{name}: this rank's shard is {tuple(target.shape)}, "
                                      f"the checkpoint's {tuple(saved[name].shape)}")
            target.copy_(saved[name])
    params = [p for group in optimizer.param_groups for p in group["params"]]
    optim = shard["optimizer"]
    state: dict[int, dict[str, Any]] = {}
    for index, entry in optim["state"].items():
        param = params[int(index)]
        sharded = set(optim["sharded_keys"].get(index, ()))
        state[index] = {key: as_param_shard(value, param) if key in sharded else value
                        for key, value in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": optim["param_groups"]})


def as_param_shard(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """A local tensor of `param`'s local shape as a DTensor placed like `param`."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(value.to(local(param).device), param.device_mesh,
                              param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


# ----------------------------------------------------------------------------------------
# Files: a shard, the manifest


def shard_checkpoint(run: Mapping[str, Any], rank: int, state: Mapping[str, Any]
                     ) -> dict[str, Any]:
    """A shard as a self-verifying checkpoint dict (`run`: step, run_id, world_size,
    config_sha256)."""
    payload = {"run": {k: run[k] for k in ("step", "run_id", "world_size", "config_sha256")}
               | {"rank": rank, "strategy": STRATEGY}, **state}
    return make_checkpoint(payload)


def shard_entry(checkpoint: Mapping[str, Any], relpath: str, size: int,
                file_sha256: str | None = None) -> dict[str, Any]:
    """The manifest's line for a written shard: with the digest of its file's bytes (a
    re-cut verifies a shard streaming over the file, without loading it) and its cuts."""
    entry = {"file": relpath, "sha256": checkpoint["manifest"]["payload_sha256"],
             "bytes": int(size), "host": socket.gethostname(), "node": node_rank()}
    if file_sha256 is not None:
        entry |= {"file_sha256": file_sha256, "cuts": shard_cuts(checkpoint["payload"])}
    return entry


def node_rank() -> int:
    """torchrun's node rank of this process (0 alone): with the host, where a shard lives."""
    return int(os.environ.get("GROUP_RANK", "0") or 0)


def manifest_checkpoint(payload: dict[str, Any], shards: Mapping[int, Mapping[str, Any]]
                        ) -> dict[str, Any]:
    """The manifest: `payload` (run, learner's replicated state, callbacks) plus the shard
    table, under one digest."""
    world_size = int(payload["run"]["world_size"])
    if sorted(shards) != list(range(world_size)):
        raise ValueError(f"a manifest needs one shard per rank, got ranks {sorted(shards)}")
    checkpoint = make_checkpoint({**payload, "sharded": {
        "strategy": STRATEGY, "world_size": world_size,
        "shards": {int(r): dict(shards[r]) for r in range(world_size)}}})
    checkpoint["manifest"]["strategy"] = STRATEGY
    return checkpoint


def shard_table(data: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Each rank's shard entry in manifest `data`, by rank."""
    return payload_shards(data["payload"])


def payload_shards(payload: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Each rank's shard entry in a manifest's payload, by rank."""
    return {int(r): dict(e) for r, e in payload["sharded"]["shards"].items()}


def read_shard(directory: Path, data: Mapping[str, Any], rank: int) -> dict[str, Any]:
    """Rank `rank`'s shard named by manifest `data`, verified against it (its own digest,
    the manifest's record of it, and the step and run it belongs to)."""
    entry = shard_table(data)[rank]
    path = directory / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"shard of rank {rank} is missing: {path} (written on host "
                              f"{entry.get('host')})")
    try:
        shard = read_checkpoint(path)
    except CheckpointError as exc:
        raise type(exc)(f"shard of rank {rank} (written on host {entry.get('host')}): "
                        f"{exc}") from None
    if shard["manifest"]["payload_sha256"] != entry["sha256"]:
        raise CheckpointCorruptError(
            f"shard of rank {rank} ({path}) does not match the manifest's digest of it "
            f"(recorded {entry['sha256'][:16]}..., "
            f"file {shard['manifest']['payload_sha256'][:16]}...)")
    run, mine = data["payload"]["run"], shard["payload"]["run"]
    for key in ("step", "run_id", "world_size", "config_sha256"):
        if run.get(key) != mine.get(key):
            raise CheckpointCorruptError(f"shard of rank {rank} ({path}) belongs to another "
                                         f"checkpoint: {key} {mine.get(key)!r}, manifest "
                                         f"{run.get(key)!r}")
    if mine.get("rank") != rank:
        raise CheckpointCorruptError(f"{path} holds the shard of rank {mine.get('rank')}, "
                                     f"not {rank}")
    return shard


def check_shard(directory: Path, data: Mapping[str, Any], rank: int) -> str | None:
    """None when rank `rank`'s shard verifies, else what is wrong with it (one line)."""
    try:
        read_shard(directory, data, rank)
    except CheckpointError as exc:
        return str(exc)
    return None


def shard_problems_here(data: Mapping[str, Any], path: Path) -> list[str]:
    """What is wrong with the shards of manifest `data` (at `path`) that this node can
    judge: every shard it can see must verify, and none written on this node (host and
    torchrun node rank) may be missing. Empty for an unsharded checkpoint. Shards written
    on other nodes and absent here (`shards_elsewhere`) are for their own ranks to check."""
    if not is_sharded_checkpoint(data):
        return []
    elsewhere = set(shards_elsewhere(data, path))
    return [problem for rank in sorted(shard_table(data)) if rank not in elsewhere
            and (problem := check_shard(Path(path).parent, data, rank)) is not None]


def shards_elsewhere(data: Mapping[str, Any], path: Path) -> list[int]:
    """The ranks whose shard of manifest `data` (at `path`) this node cannot judge: written
    on another node (host and torchrun node rank) and absent here."""
    if not is_sharded_checkpoint(data):
        return []
    here = (socket.gethostname(), node_rank())
    return [rank for rank, entry in sorted(shard_table(data).items())
            if (entry.get("host"), entry.get("node", 0)) != here
            and not (Path(path).parent / entry["file"]).is_file()]


def check_shards_here(data: Mapping[str, Any], path: Path,
                      elsewhere: Callable[[Path, Mapping[str, Any]], list[str]] | None = None
                      ) -> None:
    """Before a resume from a named checkpoint changes anything (rank 0): refuse naming
    each bad shard and its host (`shard_problems_here`, then what `elsewhere` hears from
    the ranks that hold the others)."""
    problems = shard_problems_here(data, path)
    if not problems and elsewhere is not None:
        problems = elsewhere(path, data)
    if problems:
        raise CheckpointError(f"cannot resume from the sharded checkpoint {path}: "
                              + "; ".join(problems) + ". Nothing was changed.")


def check_compatible(data: Mapping[str, Any], path: Path | str, strategy: str,
                     world_size: int | None) -> None:
    """Refuse a checkpoint of another strategy or world size (None: any), naming the
    difference."""
    saved = data["payload"]["sharded"]["strategy"] if is_sharded_checkpoint(data) else "ddp"
    saved_world = int(data["manifest"]["world_size"])
    problems = []
    if saved != strategy:
        problems.append(f"trainer.strategy: checkpoint {saved}, this run {strategy}")
    if world_size is not None and saved_world != world_size:
        problems.append(f"world size: checkpoint {saved_world}, this run {world_size}")
    if problems:
        raise CheckpointError(f"{path} cannot be restored here: " + "; ".join(problems)
                              + " (another strategy cannot continue it; another world size "
                              "only under trainer.global_batch_size)")


# ----------------------------------------------------------------------------------------
# Consolidation (export), in one process


def consolidated_model(path: Path, data: Mapping[str, Any], *, ema: bool = False
                       ) -> dict[str, torch.Tensor]:
    """The full model (or EMA) state_dict of sharded manifest `data` at `path`, from every
    verified shard: dim-0 shards concatenated in rank order."""
    directory = path.parent
    world_size = int(data["manifest"]["world_size"])
    shards = [read_shard(directory, data, r)["payload"] for r in range(world_size)]
    key = "ema" if ema else "model"
    if ema and shards[0].get("ema") is None:
        raise CheckpointError(f"{path} holds no EMA weights (the run had no trainer.ema)")
    placements = shards[0]["placements"]
    full: dict[str, torch.Tensor] = {}
    for name, placement in placements.items():
        parts = [s[key][name] for s in shards]
        shape = tuple(placement["global_shape"])
        if placement["kind"] == "replicated":
            full[name] = parts[0].clone()
        elif placement["kind"] == "shard0":
            full[name] = torch.cat(parts, dim=0) if shape else parts[0].clone()
        else:
            raise CheckpointError(f"{path}: {name} is sharded as {placement['placements']}; "
                                  "only dim-0 shards can be consolidated")
        if tuple(full[name].shape) != shape:
            raise CheckpointCorruptError(f"{path}: the shards of {name} make "
                                         f"{tuple(full[name].shape)}, expected {shape}")
    return full
