"""How the model is spread over the ranks (R-STRAT-1): the `Strategy` interface (`base`)
and a class per `trainer.strategy`: `ddp` (the whole model on every rank) and `fsdp`
(sharded with FSDP2)."""

from __future__ import annotations

import torch

from embodichain.core.training.strategies.base import (
    Snapshot,
    SpreadOptions,
    Strategy,
    ValidationFailed,
)
from embodichain.core.training.strategies.ddp import DdpStrategy
from embodichain.core.training.strategies.fsdp import FsdpStrategy

STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in (DdpStrategy, FsdpStrategy)}


def make_strategy(name: str, device: torch.device, precision: str,
                  options: SpreadOptions | None = None) -> Strategy:
    """The strategy called `name` (`trainer.strategy`), with the factory's and the recipe's
    options for spreading the model (each strategy reads those that apply to it)."""
    if name not in STRATEGIES:
        raise ValueError(f"trainer.strategy must be one of {sorted(STRATEGIES)}, got {name!r}")
    return STRATEGIES[name](device, precision, options)


__all__ = ["STRATEGIES", "Snapshot", "SpreadOptions", "Strategy", "ValidationFailed",
           "make_strategy"]
