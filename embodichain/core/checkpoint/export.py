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
from embodichain.core.checkpoint.formats import format_of
from embodichain.core.checkpoint.names import is_checkpoint_name
from embodichain.core.checkpoint.single_file import NoEmaWeights
from embodichain.core.errors import CheckpointError, UsageError


@dataclass(frozen=True)
class Exported:
    """What was written: where, from which update, how many tensors and numbers in them."""

    path: Path
    step: int
    tensors: int
    numbers: int
    ema: bool


def checkpoint_model(path: Path, data: Mapping[str, Any], *, ema: bool = False
                     ) -> dict[str, torch.Tensor]:
    """The whole model's (or its EMA's) state_dict in the verified checkpoint `data` at
    `path`, as its format gives it: a sharded one's shards each verified, then concatenated
    (R-SHARD-4)."""
    try:
        return format_of(data).whole_model(data, path, ema=ema)
    except CheckpointError as exc:
        if ema and "no EMA" in str(exc):
            raise NoEmaWeights(str(exc)) from None
        raise


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
