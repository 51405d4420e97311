"""Small values between the host and the device without waiting for either (R-GPU-1).

Each update sends its flags (stop, note, data wait, part counts) to the device and gets
back its reduced totals and decisions. On CUDA both go through pinned host buffers
with `non_blocking` copies, and the host reads a result only once its copy has arrived (an
event recorded after it): one update later, by when the device has long finished it, or at
a log, save or validation. The host reads the buffer's memory directly (ctypes), not
through a tensor. Buffers are used in turn (two per size): a buffer is written again only
after the copies of the update that last used it have completed.
"""

from __future__ import annotations

import ctypes

import torch

_TURNS = 2


class Slot:
    """One update's pair of host buffers (flags out, results back) and its event."""

    def __init__(self, device: torch.device, size: int) -> None:
        self.device = device
        cuda = device.type == "cuda"
        self.flags = torch.zeros(size, dtype=torch.float32, pin_memory=cuda)
        self._results: torch.Tensor | None = None
        self._view: ctypes.Array | None = None
        self._event = torch.cuda.Event() if cuda else None
        self._waiting = False

    def wait(self) -> None:
        """Until this slot's copies have completed (at once on the CPU)."""
        if self._waiting and self._event is not None:
            self._event.synchronize()
        self._waiting = False

    def to_device(self) -> torch.Tensor:
        """The flags on the device, copied without the host waiting."""
        return self.flags.to(self.device, non_blocking=True)

    def send_back(self, values: torch.Tensor) -> None:
        """Copy `values` (1-d float32, on the device) into this slot's host buffer."""
        if self._results is None or len(self._results) != len(values):
            self._results = torch.empty(len(values), dtype=torch.float32,
                                        pin_memory=self._event is not None)
            self._view = (ctypes.c_float * len(values)).from_address(
                self._results.data_ptr())
        self._results.copy_(values, non_blocking=self._event is not None)
        if self._event is not None:
            self._event.record()
            self._waiting = True

    def read(self) -> list[float]:
        """The values sent back, once they have arrived."""
        self.wait()
        assert self._view is not None
        return list(self._view)


class HostCopies:
    """The slots of one learner, handed out in turn."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._slots: dict[int, list[Slot]] = {}
        self._turn = 0

    def next_slot(self, flags_size: int) -> Slot:
        """A slot whose previous copies have completed, its flags buffer `flags_size` long."""
        slots = self._slots.setdefault(flags_size, [])
        self._turn = (self._turn + 1) % _TURNS
        while len(slots) <= self._turn:
            slots.append(Slot(self.device, flags_size))
        slot = slots[self._turn]
        slot.wait()  # read already in the steady state: returns at once
        return slot
