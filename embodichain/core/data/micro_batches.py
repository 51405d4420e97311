"""The micro-batches of one update (R-LOOP-1): the update's indices, cut into `batch_size`
pieces in the order they were drawn, each gathered only when the learner reaches it, so
that one micro-batch's inputs are resident at a time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

Batch = dict[str, torch.Tensor]


class MicroBatches(Sequence[Batch]):
    """`K * batch_size` indices as K lazily gathered batches."""

    def __init__(self, indices: torch.Tensor, batch_size: int,
                 gather: Callable[[torch.Tensor], Batch]) -> None:
        self._pieces = indices.split(batch_size)
        self._gather = gather

    def __len__(self) -> int:
        return len(self._pieces)

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        return self._gather(self._pieces[k])


def split_batch(batch: Batch, batch_size: int) -> list[Batch]:
    """A loaded batch of `K * batch_size` examples as its K micro-batches, in order (views)."""
    pieces = {name: tensor.split(batch_size) for name, tensor in batch.items()}
    return [{name: parts[k] for name, parts in pieces.items()}
            for k in range(len(next(iter(pieces.values()))))]


class TimedLoads(Sequence[Batch]):
    """An update's micro-batches as the learner reads them, with the seconds spent getting
    each (`seconds`): where a micro-batch is loaded only when it is reached (under
    `trainer.global_batch_size`, or gathered lazily from memory), that is where the update
    waits for its data (`time/data_wait`, R-SCALE-2)."""

    def __init__(self, batches: Sequence[Batch]) -> None:
        self._batches = batches
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self._batches)

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return self._batches[k]
        finally:
            self.seconds += time.perf_counter() - started
