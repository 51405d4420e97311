"""EMA of a sharded model (`trainer.ema` under `trainer.strategy: fsdp`): on the local shards.

Each rank averages only its own shards of the parameters (`ema = decay * ema + (1 - decay) *
param`, one fused `_foreach_lerp_`), so the EMA is sharded like the model and saved in each
rank's shard. Whatever computes with the EMA's weights (validation, the closed loop) gets the
sharded model itself, of the model's own class, with the EMA's shards swapped in for the
whole block (`acting`, which every rank enters together): a policy may call any of its
methods (`act_chunk`), not only `forward` (R-EVAL-5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from embodichain.core.distributed.sharding import local, reshard


class ShardedEma:
    """The averaged local shards of a sharded model's parameters, and copies of its buffers."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self._model = model
        self._sources = {n: local(p).detach() for n, p in model.named_parameters()}
        self._averaged = {n: t.clone() for n, t in self._sources.items()}
        self._source_buffers = dict(model.named_buffers())
        self._buffers = {n: b.detach().clone() for n, b in self._source_buffers.items()}
        self._keys = list(model.state_dict().keys())

    def update(self) -> None:
        self.average()
        self.copy_buffers()

    @torch.no_grad()
    def average(self) -> None:
        """The shards' half of `update` (see `Ema.average`)."""
        names = list(self._averaged)
        torch._foreach_lerp_([self._averaged[n] for n in names],
                             [self._sources[n] for n in names], 1.0 - self.decay)

    @torch.no_grad()
    def copy_buffers(self) -> None:
        """The buffers' half of `update`."""
        if self._buffers:
            torch._foreach_copy_(list(self._buffers.values()),
                                 [self._source_buffers[n] for n in self._buffers])

    def buffer_tensors(self) -> list[torch.Tensor]:
        """What `copy_buffers` changes (kept by the learner, to undo a skipped update's)."""
        return list(self._buffers.values())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Local shards keyed like the model's state_dict (a rank's part of the EMA): the
        live tensors, which a re-cut restore (checkpoint/recut.py) fills in place."""
        both = {**self._averaged, **self._buffers}
        return {k: both[k] for k in self._keys}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with torch.no_grad():
            for name, tensor in {**self._averaged, **self._buffers}.items():
                if name in state:
                    tensor.copy_(state[name])

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the EMA's weights inside the block, its own again after it."""
        pairs = [(self._sources[n], self._averaged[n]) for n in self._averaged]
        pairs += [(self._source_buffers[n].data, self._buffers[n]) for n in self._buffers]
        kept = [live.clone() for live, _ in pairs]
        # A module kept gathered after its forward (the root, reshard_after_forward: false)
        # would compute with the gathered copy, not the shards: free it on both sides.
        reshard(self._model)
        with torch.no_grad():
            for live, averaged in pairs:
                live.copy_(averaged)
        try:
            yield
        finally:
            reshard(self._model)
            with torch.no_grad():
                for (live, _), original in zip(pairs, kept, strict=True):
                    live.copy_(original)

    @contextlib.contextmanager
    def acting(self) -> Iterator[nn.Module]:
        """The sharded model, holding the EMA's weights inside the block (`applied`)."""
        with self.applied():
            yield self._model
