"""A new run's first weights from earlier ones (`train-sl --init-from`): not a resume.

The source is a checkpoint (plain, or a sharded manifest with its `shards/` beside it) or a
`state_dict` file written by `embodichain export`. Only the model's tensors are taken (the
EMA's with `ema`); the run keeps its own identity, optimizer, schedule and data order.

Rank 0 alone reads the file (other nodes need not have it, as for `--resume`), verifying it
as resume does (a sharded one is consolidated in that process), and sends every rank the
same full state_dict. Each rank then loads it into the factory's model *before* its
strategy spreads it (FSDP shards the loaded weights; DDP starts from them), through the
`pending` hook that the Learner consults: the factory builds the model as usual, and its
seed initialisation is replaced by name. Tensors are matched by name; a shape mismatch is
always refused, a tensor missing on either side unless the user allows it (a new head when
fine-tuning keeps its seed initialisation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.errors import CheckpointError, RefusedError, UsageError
from embodichain.core.file_hash import file_sha256


@dataclass(frozen=True)
class InitFrom:
    """What the user asked for: the file, EMA or model weights, and what may not match."""

    path: Path
    ema: bool = False
    allow_missing: bool = False
    allow_unexpected: bool = False


@dataclass
class InitialWeights:
    """The weights every rank loads, and what run.json records of where they came from."""

    state: dict[str, torch.Tensor]
    record: dict[str, Any]
    allow_missing: bool = False
    allow_unexpected: bool = False
    loaded: bool = field(default=False, compare=False)


def read(spec: InitFrom) -> InitialWeights:
    """The weights `spec` names, verified (raises UsageError naming the file, exit 2)."""
    from embodichain.core.checkpoint.export import NoEmaWeights, checkpoint_model
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.sharded import is_sharded_checkpoint

    path = Path(spec.path)
    if path.is_dir():
        raise UsageError(f"--init-from {path} is a directory; name a checkpoint file in it "
                         "(e.g. last.pt or step_N.pt) or an exported state_dict")
    if not path.is_file():
        raise UsageError(f"--init-from {path}: no such checkpoint or state_dict file")
    record: dict[str, Any] = {"path": str(path.resolve()), "run_id": None, "step": None,
                              "ema": spec.ema, "kind": "export",
                              "sha256": file_sha256(path)}
    try:
        data = read_checkpoint(path)
    except CheckpointError as exc:
        if "no manifest" not in str(exc):  # corrupt, unsafe, another version: as resume says
            raise
        return InitialWeights(_exported(path, spec), record, spec.allow_missing,
                              spec.allow_unexpected)
    run = data["payload"].get("run", {})
    record.update(run_id=run.get("run_id"), step=int(data["manifest"]["step"]))
    record["kind"] = "sharded checkpoint" if is_sharded_checkpoint(data) else "checkpoint"
    try:
        state = checkpoint_model(path, data, ema=spec.ema)  # every shard verified
    except NoEmaWeights as exc:
        raise UsageError(f"--init-from-ema: {exc}; drop --init-from-ema for the model's own "
                         "weights") from None
    return InitialWeights(state, record, spec.allow_missing, spec.allow_unexpected)


def _exported(path: Path, spec: InitFrom) -> dict[str, torch.Tensor]:
    """An export's state_dict: a flat mapping of names to tensors, loaded weights-only."""
    if spec.ema:
        raise UsageError(f"--init-from-ema: {path} is an exported state_dict, which holds one "
                         "set of weights (export --ema wrote the EMA's); drop --init-from-ema")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(state, Mapping) and state
            and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                    for k, v in state.items())):
        raise UsageError(f"--init-from {path} is neither an embodichain checkpoint nor a "
                         "state_dict of tensors (as `embodichain export` writes)")
    return dict(state)


def agree(spec: InitFrom) -> InitialWeights:
    """On every rank: rank 0 reads `spec`, every rank receives the same weights, or every
    rank raises rank 0's refusal (RefusedError, exit 2), rank 0 printing it."""
    from embodichain.core.distributed import process_group

    outcome: dict[str, Any] | None = None
    if process_group.is_rank_zero():
        try:
            outcome = {"weights": read(spec)}
        except UsageError as exc:
            outcome = {"refused": str(exc), "origin": process_group.rank_zero_origin()}
    outcome = process_group.broadcast_from_rank_zero(outcome)
    if "refused" in outcome:
        process_group.wait_for_rank_zero_exit(outcome["origin"])
        raise RefusedError(outcome["refused"])
    return outcome["weights"]


# ----------------------------------------------------------------------------------------
# The hook: the factory's model takes the weights before its strategy prepares it

_PENDING: list[InitialWeights] = []


@contextlib.contextmanager
def pending(weights: InitialWeights | None) -> Iterator[None]:
    """While the factory runs: the first Learner it builds loads `weights` (None: nothing).
    Refuses (UsageError) a factory that built no Learner with them."""
    if weights is None:
        yield
        return
    _PENDING.append(weights)
    try:
        yield
    finally:
        _PENDING.remove(weights)
    if not weights.loaded:
        raise UsageError("--init-from: the factory built no model to load the weights into")


def load_pending(model: nn.Module) -> None:
    """Called by the Learner with the factory's model, before the strategy spreads it:
    load the pending weights once (a no-op when none are pending)."""
    if _PENDING and not _PENDING[-1].loaded:
        load_into(model, _PENDING[-1])
        _PENDING[-1].loaded = True


def load_into(model: nn.Module, weights: InitialWeights) -> None:
    """Copy `weights` into `model` by name, refusing (UsageError) every shape mismatch, and
    tensors missing on either side unless allowed, before changing anything."""
    own = model.state_dict()
    source = weights.state
    where = weights.record["path"]
    mismatched = [f"{name}: {tuple(source[name].shape)} in {where}, {tuple(t.shape)} in the "
                  "model" for name, t in own.items()
                  if name in source and tuple(source[name].shape) != tuple(t.shape)]
    missing = sorted(set(own) - set(source))
    unexpected = sorted(set(source) - set(own))
    problems = [f"shape mismatch: {m}" for m in mismatched]
    if missing and not weights.allow_missing:
        problems.append(f"missing from {where} ({len(missing)}; the model's own "
                        f"initialisation would stay; allow with --init-allow-missing): "
                        + ", ".join(missing))
    if unexpected and not weights.allow_unexpected:
        problems.append(f"not in the model ({len(unexpected)}; they would be dropped; allow "
                        "with --init-allow-unexpected): " + ", ".join(unexpected))
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise UsageError(f"--init-from {where}: its tensors do not match the model's\n{listed}"
                         "\nNothing was started.")
    with torch.no_grad():
        model.load_state_dict({n: source[n] for n in own if n in source}, strict=False)
