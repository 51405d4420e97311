"""The order under `trainer.global_batch_size: G` (R-ELASTIC-2): world-size free.

The G example indices of update `u` are a stateless function of (seed, u, position in the
global batch), a `GlobalDraw`; rank r of W takes the contiguous slice
`[r * G / W, (r + 1) * G / W)` of them. So every world size trains update u on the same
examples, and the sampler's whole state is one global position: the updates drawn. A
weighted draw (a mixture of datasets) is another `GlobalDraw`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from embodichain.core.data.samplers import epoch_permutation
from embodichain.core.errors import UsageError


class GlobalDraw(Protocol):
    """The G indices of an update, in global order (position 0 .. G-1)."""

    global_batch_size: int

    def __call__(self, update: int) -> torch.Tensor: ...


def update_seed(seed: int, update: int) -> int:
    """The 63-bit seed of update `update`'s draw: the same on every rank and world size."""
    digest = hashlib.sha256(f"embodichain-global-draw:{seed}:{update}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class ReplacementDraw:
    """G indices uniformly with replacement, from a generator seeded by (seed, update):
    a counter-based draw, so update u needs no state from the updates before it."""

    def __init__(self, corpus_size: int, global_batch_size: int, seed: int) -> None:
        self.corpus_size, self.global_batch_size, self.seed = corpus_size, global_batch_size, seed

    def __call__(self, update: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(update_seed(self.seed, update))
        return torch.randint(self.corpus_size, (self.global_batch_size,), generator=generator)


class EpochDraw:
    """The next G of each epoch's seeded permutation (the permutation of `sampling: epochs`
    without G): update u is the (u mod B)-th slice of G of epoch u div B, B = corpus // G.
    The fewer than G examples left at an epoch's end are dropped for that epoch."""

    def __init__(self, corpus_size: int, global_batch_size: int, seed: int) -> None:
        self.corpus_size, self.global_batch_size, self.seed = corpus_size, global_batch_size, seed
        self.updates_per_epoch = corpus_size // global_batch_size
        if self.updates_per_epoch == 0:
            raise UsageError(
                f"trainer.sampling: epochs needs at least trainer.global_batch_size = "
                f"{global_batch_size} examples, the corpus has {corpus_size}")
        self._permutation: tuple[int, torch.Tensor] | None = None

    def epoch_of(self, update: int) -> int:
        return update // self.updates_per_epoch

    def epoch_order(self, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s order of the corpus (a weighted draw orders it otherwise)."""
        return epoch_permutation(self.seed, epoch, self.corpus_size)

    def __call__(self, update: int) -> torch.Tensor:
        epoch, b = divmod(update, self.updates_per_epoch)
        if self._permutation is None or self._permutation[0] != epoch:
            self._permutation = (epoch, self.epoch_order(epoch))
        g = self.global_batch_size
        return self._permutation[1][b * g:(b + 1) * g]


class GlobalOrderSampler:
    """This rank's slice of each update's global draw; `first_position` is the global
    position of the slice's first example (per-example seeds use global positions)."""

    def __init__(self, draw: GlobalDraw, rank: int, world_size: int) -> None:
        self.draw = draw
        self.share = draw.global_batch_size // world_size
        self.first_position = rank * self.share
        self.batches_drawn = 0  # updates drawn: the global position is this times G

    @property
    def epoch(self) -> int | None:
        """The epoch (from 0) of the last update drawn, under `sampling: epochs`."""
        epoch_of = getattr(self.draw, "epoch_of", None)
        return None if epoch_of is None else epoch_of(max(0, self.batches_drawn - 1))

    def next_indices(self) -> torch.Tensor:
        update, self.batches_drawn = self.batches_drawn, self.batches_drawn + 1
        start = self.first_position
        return self.draw(update)[start:start + self.share].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "global", "batches_drawn": self.batches_drawn,
                "global_batch_size": self.draw.global_batch_size,
                "corpus_size": getattr(self.draw, "corpus_size", None)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "global":
            raise ValueError("the checkpoint's sampler state is not that of "
                             "trainer.global_batch_size")
        self.batches_drawn = int(state["batches_drawn"])


def global_sampler(sampling: str, corpus_size: int, global_batch_size: int, seed: int,
                   rank: int, world_size: int) -> GlobalOrderSampler:
    """The sampler of `trainer.sampling` under `trainer.global_batch_size`, for this rank."""
    draw_type = EpochDraw if sampling == "epochs" else ReplacementDraw
    return GlobalOrderSampler(draw_type(corpus_size, global_batch_size, seed), rank, world_size)
