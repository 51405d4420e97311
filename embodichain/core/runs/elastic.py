"""When a run may continue on another number of ranks (R-ELASTIC-3). Torch-free.

Under `trainer.global_batch_size` G an update trains the same G examples, drawn by global
position, on any world size (core/data/global_order.py), so a checkpoint may continue on
another world size when both recipes set the same G. The micro-batch (`trainer.batch_size`)
and the micro-batches per update (`trainer.grad_accumulation`, derived as G / (world size x
batch size)) then change memory and summation order, not the examples: both are resumable
changes under G. Without G the examples of an update depend on the world size, so a change is
refused (naming G as the way to allow it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Keys that may differ on resume when both recipes set the same global batch size.
ELASTIC_KEYS = ("trainer.batch_size", "trainer.grad_accumulation")


def global_batch_size(config: Mapping[str, Any]) -> int | None:
    """A resolved recipe's `trainer.global_batch_size` (None: not set)."""
    trainer = config.get("trainer") if isinstance(config, Mapping) else None
    value = trainer.get("global_batch_size") if isinstance(trainer, Mapping) else None
    return int(value) if isinstance(value, int) else None


def continues_on_any_world_size(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether a checkpoint trained with recipe `saved` may continue as `current` on another
    world size: both set the same global batch size."""
    g = global_batch_size(saved)
    return g is not None and g == global_batch_size(current)


def without_derived_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored (resolved) recipe as it can be launched again on any world size: under G its
    `trainer.grad_accumulation` was derived for the world size that ran it, so it is left out
    (derived again for the new one). Without G the recipe is returned as it is."""
    result = dict(config)
    if global_batch_size(config) is not None:
        result["trainer"] = {k: v for k, v in config["trainer"].items()
                             if k != "grad_accumulation"}
    return result


def world_size_change(saved_world_size: Any, world_size: int, step: int
                      ) -> dict[str, int] | None:
    """run.json's record of a continuation on another world size (None: the same)."""
    if not isinstance(saved_world_size, int) or saved_world_size == world_size:
        return None
    return {"from": saved_world_size, "to": world_size, "at_update": step}
