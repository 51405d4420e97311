"""Two runs' snapshots compared tensor by tensor (R-TRUST-5): for each update both saved, a
digest of every tensor and every other value of the training state (model, optimizer,
scheduler, EMA, each rank's RNG streams, sampler and buffers, callbacks, a sharded
checkpoint's shards), and the first path whose digest differs.

What is the run's identity rather than its state (run id, times, its directory in the
recipe, the recorded versions: the keys its run.json holds) is left out; the metrics a
clock decides too (`reproduce.reproducible`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodichain.core.runs.reproduce import Difference, reproducible, snapshot_steps


@dataclass(frozen=True)
class Leaf:
    """One value of a snapshot: its digest, and what it is (`float32 (32, 4)`, `int`)."""

    digest: str
    kind: str
    value: Any


@dataclass(frozen=True)
class SnapshotsCompared:
    names: tuple[str, ...]  # the original's files compared, by update
    tensors: int  # tensors compared in each run
    difference: Difference | None
    last_step: int = 0  # the last update whose snapshots were compared


def compare_snapshots(original: Path, reproduction: Path, through: int,
                      identity_keys: Collection[str]) -> SnapshotsCompared:
    """Every update through `through` that both runs saved, in order, until one differs."""
    from embodichain.core.checkpoint.file import read_checkpoint

    mine, theirs = snapshot_steps(original), snapshot_steps(reproduction)
    names: list[str] = []
    tensors = last = 0
    for step in sorted(set(mine) & set(theirs)):
        if step > through:
            break
        last = step
        a, b = (dict(leaves(training_state(path, read_checkpoint(path), identity_keys)))
                for path in (mine[step], theirs[step]))
        names.append(mine[step].name)
        tensors += sum(1 for leaf in a.values() if leaf.kind.startswith("tensor"))
        difference = first_difference(a, b)
        if difference is not None:
            what, detail = difference
            return SnapshotsCompared(tuple(names), tensors, Difference(
                step, what, f"{detail} ({mine[step].name} vs {theirs[step].name})"))
    return SnapshotsCompared(tuple(names), tensors, None, last)


def training_state(path: Path, data: Mapping[str, Any], identity_keys: Collection[str]
           ) -> dict[str, Any]:
    """A verified checkpoint's training state: its payload without the run's identity, and
    the parts kept beside it (a sharded manifest's shards: each rank's own state, without
    identity) in place of the table that names them."""
    from embodichain.core.checkpoint.formats import format_of

    fmt = format_of(data)
    payload = data["payload"]
    bookkeeping = set(fmt.parts_view(data)["payload"])  # the parts' table, with the run
    state = {k: v for k, v in payload.items() if k not in bookkeeping | {"run"}}
    state["run"] = _run_state(payload["run"], identity_keys)
    parts = fmt.parts(data)
    if parts:
        state["parts"] = {}
        for part in sorted(parts):
            own = fmt.read_part(path.parent, data, part)
            state["parts"][part] = {k: (_run_state(v, identity_keys) if k == "run" else v)
                                    for k, v in own.items()}
    return state


def _run_state(run: Mapping[str, Any], identity_keys: Collection[str]) -> dict[str, Any]:
    state = {k: v for k, v in run.items() if k not in identity_keys}
    if isinstance(state.get("metrics"), Mapping):
        state["metrics"] = reproducible(state["metrics"])
    return state


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Leaf]]:
    """Each value of a nested state by its dotted path: mappings and sequences that hold
    containers or tensors are walked; anything else is one leaf with its digest."""
    import torch

    from embodichain.core.checkpoint.file import payload_digest

    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}" if path else str(key))
        return
    if isinstance(value, list | tuple) and any(
            isinstance(item, Mapping | list | tuple | torch.Tensor) for item in value):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
        return
    if isinstance(value, torch.Tensor):
        kind = f"tensor {str(value.dtype).removeprefix('torch.')} {tuple(value.shape)}"
    else:
        kind = type(value).__name__
    yield path, Leaf(payload_digest(value), kind, value)


def first_difference(a: Mapping[str, Leaf], b: Mapping[str, Leaf]) -> tuple[str, str] | None:
    """The first path (in the original's order) whose value differs, or that only one side
    has: `(what, detail)`; None when every digest agrees."""
    for path, leaf in a.items():
        other = b.get(path)
        if other is None:
            return path, "absent in the reproduction's snapshot"
        if leaf.digest != other.digest:
            return f"{leaf.kind.split(' ')[0]} {path}", _detail(leaf, other)
    extra = next((p for p in b if p not in a), None)
    return None if extra is None else (extra, "absent in the original's snapshot")


def _detail(a: Leaf, b: Leaf) -> str:
    """The digests, and how far apart the values are where that says something."""
    import torch

    text = f"sha256 {a.digest[:12]} in the original, {b.digest[:12]} in the reproduction"
    if a.kind != b.kind:
        return f"{a.kind} in the original, {b.kind} in the reproduction"
    if isinstance(a.value, torch.Tensor) and a.value.is_floating_point():
        gap = (a.value.double() - b.value.double()).abs()
        return (f"{a.kind}: {int((gap != 0).sum())} of {gap.numel()} elements differ, by "
                f"up to {gap.max().item():.3g}; {text}")
    if not isinstance(a.value, torch.Tensor) and len(repr(a.value)) <= 80:
        return f"{a.value!r} in the original, {b.value!r} in the reproduction"
    return f"{a.kind}: {text}"
