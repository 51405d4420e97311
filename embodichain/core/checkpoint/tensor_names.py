"""A model whose tensors are not the checkpoint's (a module renamed, added or removed since):
refused before anything is loaded, naming what is missing and what is unexpected."""

from __future__ import annotations

from collections.abc import Iterable

from embodichain.core.errors import CheckpointError

SHOWN = 8  # names listed of each kind; the rest are counted


class TensorMismatch(CheckpointError):
    """The model's tensor names differ from the checkpoint's (exit 2)."""

    def __init__(self, message: str, missing: list[str], unexpected: list[str]) -> None:
        super().__init__(message)
        self.missing = missing
        self.unexpected = unexpected


def refuse_other_tensors(model: Iterable[str], saved: Iterable[str], where: str) -> None:
    """Raise TensorMismatch unless the model's tensor names (`model`) are the checkpoint's
    (`saved`, of `where`): those the checkpoint lacks ("missing") and those the model lacks
    ("unexpected"), as torch's `load_state_dict` calls them."""
    own, theirs = set(model), set(saved)
    if own == theirs:
        return
    missing, unexpected = sorted(own - theirs), sorted(theirs - own)
    raise TensorMismatch(
        f"the model's tensors differ from {where}'s: missing from the checkpoint "
        f"{_listed(missing)}; unexpected (in the checkpoint, not in the model) "
        f"{_listed(unexpected)}", missing, unexpected)


def _listed(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:SHOWN])
    return f"({len(names)}): {shown}" + (f", ... {len(names) - SHOWN} more"
                                         if len(names) > SHOWN else "")
