"""How the model is spread over the ranks (R-STRAT-1): the `Strategy` interface (`base`)
and a class per `trainer.strategy`: `ddp` (the whole model on every rank) and `fsdp`
(sharded with FSDP2)."""

from __future__ import annotations

import torch

from embodichain.core.training.strategies.base import Snapshot, Strategy, ValidationFailed
from embodichain.core.training.strategies.ddp import DdpStrategy
from embodichain.core.training.strategies.fsdp import FsdpStrategy

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (DdpStrategy, FsdpStrategy)}


def make_strategy(name: str, device: torch.device, precision: str) -> Strategy:
    """The strategy called `name` (`trainer.strategy`)."""
    if name not in STRATEGIES:
        raise ValueError(f"trainer.strategy must be one of {sorted(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name](device, precision)


__all__ = ["STRATEGIES", "Snapshot", "Strategy", "ValidationFailed", "make_strategy"]
