"""Exporting a trained model: a checkpoint's weights as a plain `state_dict` file.

A checkpoint keeps the model under `payload.learner.model`, beside optimizer, schedule and
every rank's state. `export` writes just the model's `state_dict` (verified first against
the checkpoint's digest), so that `model.load_state_dict(torch.load(path, weights_only=True))`
is all a user needs. `ema=True` exports the exponential moving average instead, which a run
with `trainer.ema` keeps under `payload.learner.ema` (a state_dict, or a mapping holding one
under `model`); a checkpoint without one is refused rather than silently giving the raw
weights. A sharded checkpoint (`trainer.strategy: fsdp`) is consolidated in this one
process: every shard verified against its manifest, the dim-0 shards concatenated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.file import published_atomically, read_checkpoint
from embodichain.core.checkpoint.names import is_checkpoint_name
from embodichain.core.checkpoint.sharded import consolidated_model, is_sharded_checkpoint
from embodichain.core.errors import CheckpointError, UsageError


@dataclass(frozen=True)
class Exported:
    """What was written: where, from which update, how many tensors and numbers in them."""

    path: Path
    step: int
    tensors: int
    numbers: int
    ema: bool


class NoEmaWeights(UsageError):
    """The checkpoint holds no EMA weights (its caller says how to do without them)."""


def checkpoint_model(path: Path, data: Mapping[str, Any], *, ema: bool = False
                     ) -> dict[str, torch.Tensor]:
    """The whole model's (or its EMA's) state_dict in the verified checkpoint `data` at
    `path`: a sharded one's shards each verified, then concatenated (R-SHARD-4)."""
    if not is_sharded_checkpoint(data):
        return model_state(data, path, ema=ema)
    try:
        return consolidated_model(path, data, ema=ema)
    except CheckpointError as exc:
        if ema and "no EMA" in str(exc):
            raise NoEmaWeights(str(exc)) from None
        raise


def model_state(data: Mapping[str, Any], source: Path, *, ema: bool = False
                ) -> dict[str, torch.Tensor]:
    """The model's (or its EMA's) state_dict in a verified unsharded checkpoint `data`."""
    learner = data["payload"]["learner"]
    if not ema:
        return dict(learner["model"])
    found = learner.get("ema")
    if found is None:
        raise NoEmaWeights(f"{source} holds no EMA weights (the run had no trainer.ema when "
                           "it wrote this checkpoint)")
    if isinstance(found, Mapping) and isinstance(found.get("model"), Mapping):
        found = found["model"]
    if not (isinstance(found, Mapping)
            and all(isinstance(v, torch.Tensor) for v in found.values())):
        raise UsageError(f"{source}: its EMA entry is not a state_dict of tensors; this "
                         "embodichain cannot export it")
    return dict(found)


def export_model(checkpoint: Path, out: Path, *, ema: bool = False, force: bool = False,
                 data: Mapping[str, Any] | None = None) -> Exported:
    """Write the model state_dict of `checkpoint` to `out`, atomically. `data`: the
    checkpoint's content when the caller has already read and verified it.

    Refuses (UsageError, exit 2; nothing written) an existing `out` unless `force`, `out`
    being the checkpoint itself, and names that run directories read as checkpoints.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    if out.exists() and out.resolve() == checkpoint.resolve():
        raise UsageError(f"{out} is the checkpoint itself; export to another file")
    if is_checkpoint_name(out.name):
        raise UsageError(f"{out}: {out.name} is a checkpoint's name (resume and runs would "
                         "read it as one); choose another name, e.g. model.pt")
    if out.is_dir():
        raise UsageError(f"{out} is a directory; name the file to write, e.g. {out}/model.pt")
    if out.exists() and not force:
        raise UsageError(f"{out} exists; nothing was written. Pass --force to replace it")
    if data is None:
        data = read_checkpoint(checkpoint)  # digest-verified, never runs code from the file
    try:
        whole = checkpoint_model(checkpoint, data, ema=ema)
    except NoEmaWeights as exc:
        raise UsageError(f"{exc}; export without --ema for the model's own weights") from None
    state = {k: v.detach().clone().contiguous() for k, v in whole.items()}
    _save_atomically(state, out)
    return Exported(out, int(data["manifest"]["step"]), len(state),
                    sum(v.numel() for v in state.values()), ema)


def _save_atomically(state: dict[str, torch.Tensor], out: Path) -> None:
    with published_atomically(out) as tmp:
        torch.save(state, tmp)
