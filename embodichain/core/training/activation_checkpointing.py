"""`trainer.activation_checkpointing` (R-OPS-4): sub-modules of named classes keep only their
inputs in the forward and run their forward again in the backward, trading time for
activation memory.

torch's composable `checkpoint` (torch.distributed._composable) is applied to each chosen
module before the strategy spreads the model: it is non-reentrant checkpointing installed as
forward hooks, so the module tree and every parameter's name stay as they were (checkpoints
load with or without it; `checkpoint_wrapper` would insert `_checkpoint_wrapped_module.`
into every name), DDP and FSDP2's `fully_shard` wrap the model as usual (FSDP2 gathers a
block's parameters again for its recomputation through its own hooks), and the recomputation
re-enters the forward's autocast state. The forward's RNG state is stashed and replayed
(`preserve_rng_state`), so dropout masks are the same both times and training is bitwise the
run without it; the global RNG stream is left as the forward left it.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from embodichain.core.errors import UsageError
from embodichain.core.observe.progress import log


def checkpointed_modules(model: nn.Module, classes: Sequence[str]) -> list[tuple[str, nn.Module]]:
    """The sub-modules of `model` whose class is named in `classes`, outermost only (one
    inside another is recomputed with it already), as `(name, module)`; a UsageError (exit 2)
    naming the sub-module classes the model has when a name matches none of them."""
    present = {type(m).__name__ for _, m in model.named_modules() if m is not model}
    unknown = [c for c in dict.fromkeys(classes) if c not in present]
    if unknown:
        raise UsageError(
            f"trainer.activation_checkpointing.modules: {', '.join(map(repr, unknown))} "
            f"{'is not a class' if len(unknown) == 1 else 'are not classes'} of the model's "
            f"sub-modules; the model has: {', '.join(sorted(present)) or 'none'}")
    wanted = set(classes)
    chosen: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if module is model or type(module).__name__ not in wanted:
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in chosen):
            continue
        chosen.append((name, module))
    return chosen


def apply_activation_checkpointing(model: nn.Module, classes: Sequence[str]) -> list[str]:
    """Checkpoint the sub-modules of `model` of the classes named (see module doc), in place;
    the names of those checkpointed. Before any DDP or FSDP wrapping."""
    if not classes:
        return []
    from torch.distributed._composable import checkpoint

    chosen = checkpointed_modules(model, classes)
    for _, module in chosen:
        checkpoint(module, preserve_rng_state=True)  # dropout's masks replayed
    names = [name for name, _ in chosen]
    log.info("activation checkpointing: %d modules recompute their forward in the backward "
             "(%s)", len(names), ", ".join(names[:8]) + (", ..." if len(names) > 8 else ""))
    return names


__all__ = ["apply_activation_checkpointing", "checkpointed_modules"]
