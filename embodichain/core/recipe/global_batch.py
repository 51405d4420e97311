"""Whether `trainer.global_batch_size` G can be served (R-ELASTIC-1): K = G / (world size x
batch_size) must be a whole number >= 1, agreeing with an explicit `grad_accumulation`.
Read off a TrainerConfig (schema.py), torch-free."""

from __future__ import annotations

from typing import Any


def global_batch_problem(t: Any, world_size: int | None) -> str | None:
    """Why `trainer.global_batch_size` cannot be served on `world_size` ranks (None: on
    some world size), naming G, the world size and the batch size; None when it can."""
    g, b = t.global_batch_size, t.batch_size
    if g is None:
        return None
    if g > 2**31 - 1:  # drawn as one tensor of indices, as batch_size x grad_accumulation
        return f"trainer.global_batch_size: expected at most {2**31 - 1}, got {g}"
    explicit = "grad_accumulation" in t.model_fields_set
    if world_size is None:
        per_rank = b * t.grad_accumulation if explicit else b
        if g % per_rank:
            what = (f"batch_size x grad_accumulation = {b} x {t.grad_accumulation}"
                    if explicit else f"batch_size {b}")
            unset = ("; leave trainer.grad_accumulation unset: under global_batch_size it is "
                     "derived for each world size" if explicit and g % b == 0 else "")
            return (f"trainer.global_batch_size: {g} is not a whole multiple of trainer.{what}, "
                    f"so no world size divides it into whole micro-batches per rank{unset}")
        return None
    if g % (world_size * b):
        return (f"trainer.global_batch_size: {g} is not a whole multiple of world size x "
                f"batch_size = {world_size} x {b} = {world_size * b}: the micro-batches per "
                "update, K = "
                "G / (world size x batch_size), must be a whole number >= 1; change "
                "trainer.batch_size, trainer.global_batch_size or the number of ranks"
                + _world_sizes_that_divide(g, b))
    k = g // (world_size * b)
    if explicit and t.grad_accumulation != k:
        return (f"trainer.grad_accumulation: {t.grad_accumulation} disagrees with trainer."
                f"global_batch_size {g} / (world size {world_size} x batch_size {b}) = {k}; "
                "leave grad_accumulation unset (it is derived) or set it to the derived value")
    return None


def _world_sizes_that_divide(g: int, b: int, shown: int = 12) -> str:
    """`(world sizes that can: 1, 2, 4, 8)`: those that divide G into micro-batches of b."""
    if g % b:
        return ""
    units = g // b
    sizes = [w for w in range(1, min(units, 1 << 20) + 1) if units % w == 0]
    listed = ", ".join(map(str, sizes[:shown])) + (", ..." if len(sizes) > shown else "")
    return f" (world sizes that can, with batch_size {b}: {listed})"
