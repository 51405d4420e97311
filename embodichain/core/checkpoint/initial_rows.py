"""`--init-from`'s load: each rank copies only its own rows (initial_weights.py decides what).

The file(s) are laid out as a sharded checkpoint's shard table (a plain checkpoint or an
export is one piece holding every tensor whole), so the FSDP re-cut's exchange plans it
(recut_exchange.py): every rank states which files it sees and which rows it needs; a file
no rank sees is refused by name; one that a rank needing it does not see is sent, those
rows only and one tensor at a time, by the lowest rank that sees it. Every file read or sent
is verified first (its sha256 streamed, as rank 0 recorded it or the manifest did), and every
rank learns every problem, so all refuse alike before anything is loaded. A rank maps each
file (`torch.load(mmap=True)`) in turn and copies the rows of its own tensors: the whole
tensor for a DDP rank's model, its dim-0 shard's rows for an FSDP rank's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint import recut_exchange as exchange
from embodichain.core.distributed import process_group
from embodichain.core.distributed.sharding import dim0_cut, local
from embodichain.core.errors import CheckpointCorruptError, CheckpointError
from embodichain.core.file_hash import file_sha256


def load_rows(model: nn.Module, names: Sequence[str], *, directory: str,
              pieces: Mapping[int, Mapping[str, Any]], view: str, where: str) -> None:
    """Copy the tensors `names` of the files `pieces` (initial_weights.InitialWeights) into
    `model` (spread by its strategy), this rank's rows of each (collective: every rank
    calls it with the same `names`). `where` names the source in messages."""
    own = model.state_dict()
    folder = Path(directory)
    pieces = {k: {**e, "cuts": {"model": {n: e["cuts"]["model"].get(n) for n in names},
                                "optimizer": {}}}
              for k, e in pieces.items()}
    mine = {"model": {n: own_cut(own[n]) for n in names}, "params": []}
    need = {k for k, e in pieces.items() if exchange.row_pairs(e["cuts"], mine, False)}
    views = exchange.gather_view(pieces, folder, need, mine)
    plan = exchange.plan(pieces, folder, views)
    rank = process_group.rank()
    problems = [p for k in plan.verify[rank]
                if (p := _check(folder, k, pieces[k])) is not None]
    everyone = process_group.broadcast_from_rank_zero(process_group.gather_to_rank_zero(problems))
    unique = list(dict.fromkeys([*plan.unreachable, *(p for found in everyone for p in found)]))
    if unique:
        raise CheckpointError(f"--init-from {where}: " + "; ".join(unique)
                              + ". Nothing was loaded.")

    def target(key: tuple) -> torch.Tensor:
        value = local(own[key[1]])
        return value.reshape(1) if value.dim() == 0 else value

    copied: dict[str, int] = {}
    for k in sorted(set(plan.read[rank]) | set(plan.sends)):
        cuts = pieces[k]["cuts"]
        src, dsts = plan.sends.get(k, (None, []))
        shard = None
        if k in plan.read[rank] or src == rank:
            shard = _mapped(folder / pieces[k]["file"], view, names)
        with torch.no_grad():
            if k in plan.read[rank]:
                for key, cut, new in exchange.row_pairs(cuts, plan.cuts[rank], False):
                    a, b = exchange.overlap(cut, new)  # type: ignore[misc]
                    target(key)[a - new[0]:b - new[0]].copy_(
                        exchange.source(shard, key)[a - cut[0]:b - cut[0]])
                    copied[key[1]] = copied.get(key[1], 0) + b - a
            if src == rank:
                for dst in dsts:
                    exchange.send_rows(shard, exchange.row_pairs(cuts, plan.cuts[dst], False),
                                       lambda key: own[key[1]].dtype, dst)
            elif rank in dsts:
                got = exchange.recv_rows(exchange.row_pairs(cuts, plan.cuts[rank], False),
                                         target, src)
                for key, rows in got.items():
                    copied[key[1]] = copied.get(key[1], 0) + rows
        del shard  # unmapped before the next one is mapped
    for name, cut in mine["model"].items():
        if cut is not None and copied.get(name, 0) != cut[1]:
            raise CheckpointCorruptError(f"--init-from {where}: its files "
                                         f"gave {copied.get(name, 0)} of the {cut[1]} rows of "
                                         f"{name} on this rank")


def own_cut(value: Any) -> tuple[int, int] | None:
    """This rank's (first row, rows) of a model tensor: an FSDP dim-0 shard's, else all of
    it (a 0-dim tensor is one row)."""
    if hasattr(value, "device_mesh") and value.dim() > 0:
        if any(type(p).__name__ == "Shard" for p in value.placements):
            cut = dim0_cut(value)
            return (cut["offset"], cut["length"])
    return (0, int(value.shape[0]) if value.dim() else 1)


def _mapped(path: Path, view: str, names: Sequence[str]) -> dict[str, Any]:
    """The file's tensors `names` memory-mapped (pages read only when touched), 0-dim ones
    as one row, under "model" as the exchange reads them."""
    data = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    tensors = tensors_in(data, view)
    return {"model": {n: t.reshape(1) if t.dim() == 0 else t
                      for n in names if (t := tensors.get(n)) is not None}}


def tensors_in(data: Mapping[str, Any], view: str) -> Mapping[str, torch.Tensor] | None:
    """The tensors of one loaded (or mapped) file, as `view` says where they sit: "flat" (an
    export), "shard.model" / "shard.ema" (a shard), "learner.model" / "learner.ema"."""
    if view == "flat":
        return data
    if view.startswith("shard."):
        return data["payload"][view.split(".")[1]]
    found = data["payload"]["learner"].get(view.split(".")[1])
    if isinstance(found, Mapping) and isinstance(found.get("model"), Mapping):
        found = found["model"]  # an EMA kept as a mapping holding its state_dict
    return found


def _check(directory: Path, k: int, piece: Mapping[str, Any]) -> str | None:
    """None when piece `k`'s file, seen here, has the bytes recorded for it."""
    path, host = directory / piece["file"], piece.get("host")
    if not path.is_file():  # seen by the exchange a moment ago
        return f"{path} is missing (written on host {host})"
    if file_sha256(path) != piece["file_sha256"]:
        return (f"{path} (written on host {host}) differs from the file rank 0 verified (or "
                "its manifest recorded): its bytes do not match")
    return None
