"""FSDP2 sharding of a model over every rank (`trainer.strategy: fsdp`, R-SHARD-1).

`shard_model` applies torch's `fully_shard` to the blocks a factory names (a transformer's
layers, each its own all-gather / reduce-scatter group), then to the root, over a 1-D
device mesh of every rank: CPU over gloo, CUDA over NCCL. Without named blocks only the root
is sharded: one group holding every parameter, which works for any model (parameters used
outside the forward of the module that owns them, shared weights, ...), at the price of
gathering the whole model in each forward.

The update must equal DDP's weighted one, `sum_r(w_r * l_r) / sum_r(w_r)`: every rank
back-propagates `w_r * l_r`, FSDP sums the gradients (reduce-scatter with SUM: the divide
factor is 1 and only SUM-type reductions are used, never AVG, which gloo gets wrong for
FSDP2, torch issue 162338), and `divide_gradients` then divides each local gradient shard by
the global weight, which the learner all-reduces beside the gradients.

Mixed precision is FSDP2's own policy: parameters are gathered in the compute dtype
(`bf16`), gradients reduced in fp32 and applied to fp32 sharded parameters.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from embodichain.core.errors import CheckpointError, UsageError

COMPUTE_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def device_mesh(device: torch.device) -> DeviceMesh:
    """The 1-D mesh of every rank on this worker's device type (`cpu` uses gloo)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("trainer.strategy: fsdp needs a process group (launch with "
                           "torchrun, or one process creates a one-rank group)")
    return init_device_mesh(device.type, (dist.get_world_size(),))


def one_rank_group(device: torch.device) -> bool:
    """A one-rank process group for a sharded run in one process (FSDP2 needs a mesh);
    whether it was created here (then the caller destroys it)."""
    if dist.is_initialized():
        return False
    import torch.distributed.nn.functional  # noqa: F401  (see process_group: before the group)

    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            store=dist.HashStore(), rank=0, world_size=1)
    return True


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for `trainer.precision`: compute in bf16, reduce and keep fp32."""
    if precision not in COMPUTE_DTYPES:
        raise ValueError(f"trainer.precision {precision!r} is not available with "
                         "trainer.strategy: fsdp (use fp32 or bf16)")
    compute = COMPUTE_DTYPES[precision]
    return MixedPrecisionPolicy(param_dtype=compute,
                                reduce_dtype=torch.float32 if compute else None)


def shard_model(model: nn.Module, device: torch.device, *,
                blocks: Iterable[nn.Module] = (), precision: str = "fp32",
                reshard_after_forward: bool = True) -> FSDPModule:
    """Shard `model` in place with FSDP2 over every rank; returns it (now an FSDPModule).

    `blocks`: sub-modules sharded as their own groups, bottom-up before the root. Each must
    be a sub-module of `model` and none may contain another (FSDP2 would nest them in the
    listed order; the order of a list is a factory's easy mistake).
    """
    mesh = device_mesh(device)
    policy = mixed_precision(precision)
    chosen = _checked_blocks(model, list(blocks))
    for block in chosen:
        fully_shard(block, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward)
    # The root's parameters are needed as soon as backward starts: keep them gathered.
    fully_shard(model, mesh=mesh, mp_policy=policy,
                reshard_after_forward=reshard_after_forward and not chosen)
    sharded: FSDPModule = model  # type: ignore[assignment]
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # SUM: we divide by the global weight
            module.set_force_sum_reduction_for_comms(True)
    return sharded


def _checked_blocks(model: nn.Module, blocks: Sequence[nn.Module]) -> list[nn.Module]:
    """`blocks` as a list, or a UsageError (exit 2: the factory's `shard_blocks` is bad input,
    refused again on any restart) naming the offending entry."""
    owned = {id(m) for m in model.modules()}
    for i, block in enumerate(blocks):
        if not isinstance(block, nn.Module) or id(block) not in owned or block is model:
            raise UsageError(f"shard_blocks[{i}] is not a sub-module of the model")
    ids = [id(b) for b in blocks]
    if len(set(ids)) != len(ids):
        raise UsageError("shard_blocks names a module twice")
    for i, outer in enumerate(blocks):
        inner = {id(m) for m in outer.modules()} - {id(outer)}
        for j, other in enumerate(blocks):
            if id(other) in inner:
                raise UsageError(f"shard_blocks[{j}] lies inside shard_blocks[{i}]; name "
                                 "blocks that do not contain each other")
    return list(blocks)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """Reduce gradients in this backward (True) or accumulate them locally (False)."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        model.set_is_last_backward(enabled)


def reshard(model: nn.Module) -> None:
    """Free every gathered parameter of `model`: the next forward gathers the shards again
    (after the shards were changed in place, e.g. the EMA's weights swapped in)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view of its storage); a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def dim0_cut(value: DTensor) -> dict[str, int]:
    """Where a dim-0-sharded DTensor's local shard lies: its first row and row count, as the
    mesh cut it (FSDP2's chunks may be uneven or empty), read off the DTensor itself and
    checked against its local tensor, never recomputed from a guess of the rule (what a
    sharded checkpoint records, and what a rank loading rows into its shard copies)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh,
                                                          value.placements)
    rows = int(value.to_local().shape[0])
    if int(shape[0]) != rows:
        raise CheckpointError(f"a shard of {rows} rows where the mesh places {shape[0]}: "
                              "cannot record where it lies")
    return {"offset": int(offset[0]), "length": rows}


def divide_gradients(parameters: Iterable[nn.Parameter], weight: torch.Tensor) -> None:
    """Divide every local gradient shard by the global weight (a zero weight: zero grads)."""
    grads = [local(p.grad) for p in parameters if p.grad is not None]
    if grads:
        torch._foreach_div_(grads, weight.reshape(()).clamp_min(torch.finfo(weight.dtype).tiny))
