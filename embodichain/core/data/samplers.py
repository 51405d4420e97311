"""`trainer.sampling`: with replacement (R-DIST-4) or in epochs (R-DATA-5).

A sampler yields one batch of corpus indices per call of `next_indices()`, from state that a
checkpoint keeps per rank (`state_dict()`: plain values and tensors), so a resumed rank
continues the same index stream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from embodichain.core.errors import UsageError


class Sampler(Protocol):
    batches_drawn: int

    def next_indices(self) -> torch.Tensor: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def stream_seed(seed: int, rank: int) -> int:
    """A 63-bit seed for (seed, rank), so ranks draw independent streams."""
    digest = hashlib.sha256(f"embodichain-sampler:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class ReplacementSampler:
    """Draws batch indices uniformly with replacement from its own generator stream."""

    def __init__(self, corpus_size: int, batch_size: int, seed: int, rank: int) -> None:
        self.corpus_size = corpus_size
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(stream_seed(seed, rank))
        self.batches_drawn = 0

    def next_indices(self) -> torch.Tensor:
        self.batches_drawn += 1
        return torch.randint(self.corpus_size, (self.batch_size,), generator=self.generator)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batches_drawn": self.batches_drawn,
                "corpus_size": self.corpus_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.batches_drawn = int(state["batches_drawn"])


def _epoch_seed(seed: int, epoch: int) -> int:
    digest = hashlib.sha256(f"embodichain-epoch:{seed}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def epoch_permutation(seed: int, epoch: int, corpus_size: int) -> torch.Tensor:
    """Epoch `epoch`'s seeded permutation of the corpus (the same on every rank)."""
    generator = torch.Generator().manual_seed(_epoch_seed(seed, epoch))
    return torch.randperm(corpus_size, generator=generator)


class EpochSampler:
    """Each epoch a seeded permutation of the corpus, dealt out disjointly to the ranks.

    The permutation depends on (seed, epoch) only, so every rank computes the same one; batch
    `b` of the epoch on rank `r` is the slice `(b * world_size + r) * batch_size` onwards. The
    examples left over (fewer than a global batch) are dropped for that epoch. The state is
    the number of batches drawn: the permutation is recomputed on resume.
    """

    def __init__(self, corpus_size: int, batch_size: int, seed: int, rank: int,
                 world_size: int) -> None:
        self.corpus_size, self.batch_size = corpus_size, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batches_per_epoch = corpus_size // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise UsageError(
                f"trainer.sampling: epochs needs at least batch_size x world size = "
                f"{batch_size} x {world_size} = {batch_size * world_size} examples, the "
                f"corpus has {corpus_size}")
        self.batches_drawn = 0
        self._permutation: tuple[int, torch.Tensor] | None = None

    @property
    def epoch(self) -> int:
        """The epoch (from 0) of the last batch drawn."""
        return max(0, self.batches_drawn - 1) // self.batches_per_epoch

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._permutation is None or self._permutation[0] != epoch:
            self._permutation = (epoch, epoch_permutation(self.seed, epoch, self.corpus_size))
        return self._permutation[1]

    def next_indices(self) -> torch.Tensor:
        epoch, batch = divmod(self.batches_drawn, self.batches_per_epoch)
        start = (batch * self.world_size + self.rank) * self.batch_size
        self.batches_drawn += 1
        return self.permutation(epoch)[start:start + self.batch_size].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "epochs", "batches_drawn": self.batches_drawn,
                "corpus_size": self.corpus_size, "batch_size": self.batch_size,
                "world_size": self.world_size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "epochs":
            raise ValueError("the checkpoint's sampler state is not that of trainer.sampling: "
                             "epochs")
        self.batches_drawn = int(state["batches_drawn"])


def make_sampler(sampling: str, corpus_size: int, batch_size: int, seed: int, rank: int,
                 world_size: int) -> Sampler:
    """The sampler `trainer.sampling` names, for this rank."""
    if sampling == "epochs":
        return EpochSampler(corpus_size, batch_size, seed, rank, world_size)
    return ReplacementSampler(corpus_size, batch_size, seed, rank)
