"""In-memory batches on their way to a CUDA device one micro-batch ahead (R-GPU-2).

A micro-batch is gathered (on the host: then copied into pinned memory) and sent to the
device on a copy stream of its own, without the host waiting, while the device computes the
one before it; the training stream waits for the copy (an event, on the device) only when
it reads the batch. The loader starts the next update's first micro-batch as soon as it
hands out the current update (data/loader.py); each later micro-batch starts when the one
before it is taken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Batch = dict[str, torch.Tensor]


class _InFlight:
    def __init__(self, batch: Batch, event: torch.cuda.Event) -> None:
        self.batch, self.event = batch, event


class DevicePrefetch:
    """Starts micro-batches' copies to `device` and hands them to the training stream."""

    def __init__(self, gather: Callable[[torch.Tensor], Batch], device: torch.device) -> None:
        self._gather = gather  # the source's own: its batch where the source holds it
        self.device = device
        self._stream = torch.cuda.Stream(device)

    def start(self, indices: torch.Tensor) -> _InFlight:
        """Gather `indices` and send the batch to the device, on the copy stream."""
        with torch.cuda.stream(self._stream):
            batch = self._gather(indices)
            moved = {k: (v.pin_memory() if v.device.type == "cpu" else v).to(
                self.device, non_blocking=True) for k, v in batch.items()}
            event = torch.cuda.Event()
            event.record(self._stream)
        return _InFlight(moved, event)

    def take(self, flight: _InFlight) -> Batch:
        """The batch, for the training stream: it waits for the copy on the device, and the
        batch's memory is not reused before the training stream is done with it."""
        current = torch.cuda.current_stream(self.device)
        current.wait_event(flight.event)
        for tensor in flight.batch.values():
            tensor.record_stream(current)
        return flight.batch

    def update(self, indices: torch.Tensor, batch_size: int) -> PrefetchedMicroBatches:
        """An update's micro-batches, its first already on its way."""
        return PrefetchedMicroBatches(self, indices.split(batch_size))


class PrefetchedMicroBatches(Sequence[Batch]):
    """An update's micro-batches, each started when the one before it is taken."""

    def __init__(self, prefetch: DevicePrefetch, pieces: Sequence[torch.Tensor]) -> None:
        self._prefetch, self._pieces = prefetch, pieces
        self._flights: dict[int, _InFlight] = {0: prefetch.start(pieces[0])}

    def __len__(self) -> int:
        return len(self._pieces)

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        flight = self._flights.pop(k, None) or self._prefetch.start(self._pieces[k])
        if k + 1 < len(self._pieces) and k + 1 not in self._flights:
            self._flights[k + 1] = self._prefetch.start(self._pieces[k + 1])
        return self._prefetch.take(flight)
