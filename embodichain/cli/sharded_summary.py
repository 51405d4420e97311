"""What `inspect-checkpoint` reads from a sharded checkpoint (R-SHARD-4): one shard at a time.

Each shard named by the manifest is loaded, verified against the manifest's digest of it and
reduced to what the report needs (global shapes, this rank's RNG / sampler / buffers) before
the next one is read, so the whole state is never in memory. A missing or damaged shard is
reported by name, not refused: inspection is where one looks at a damaged checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def sharded_parts(data: Mapping[str, Any], path: Path
                  ) -> tuple[dict[str, Any], dict[int, Any], list[dict[str, Any]]]:
    """(a learner-like dict of meta tensors in global shapes, every rank's state, the shard
    table with what verifying each shard found)."""
    from embodichain.core.checkpoint.sharded import read_shard, shard_table
    from embodichain.core.errors import CheckpointError

    learner: dict[str, Any] = dict(data["payload"].get("learner") or {})
    ranks: dict[int, Any] = {}
    table = []
    for rank, entry in sorted(shard_table(data).items()):
        row = {"rank": rank, **{k: entry.get(k) for k in ("file", "bytes", "host", "sha256")},
               "verified": False, "problem": None}
        try:
            shard = read_shard(path.parent, data, rank)["payload"]
        except CheckpointError as exc:
            row["problem"] = str(exc)
            table.append(row)
            continue
        row["verified"] = True
        table.append(row)
        ranks[rank] = shard.get("rank_state")
        if "model" not in learner:
            learner.update(_global_view(shard))
        del shard
    return learner, ranks, table


def _global_view(shard: Mapping[str, Any]) -> dict[str, Any]:
    """Model, optimizer and EMA as meta tensors of their global shapes (no data)."""
    placements = shard["placements"]

    def meta(name: str, t: torch.Tensor) -> torch.Tensor:
        return torch.empty(placements[name]["global_shape"], dtype=t.dtype, device="meta")

    model = {n: meta(n, t) for n, t in shard["model"].items()}
    optim = shard["optimizer"]
    names = optim.get("param_names") or []
    state = {}
    for index, entry in optim["state"].items():
        sharded = set(optim["sharded_keys"].get(index, ()))
        name = names[int(index)] if int(index) < len(names) else None
        state[index] = {k: meta(name, v) if k in sharded and name in placements else v
                        for k, v in entry.items()}
    ema = shard.get("ema")
    return {"model": model, "optimizer": {"param_groups": optim["param_groups"],
                                          "state": state},
            "ema": {n: meta(n, t) for n, t in ema.items()} if ema is not None else None}
