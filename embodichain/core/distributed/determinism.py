"""`trainer.deterministic: true`: the settings under which CUDA training repeats bitwise (R-DET-1).

Run to run and across a resume, on the same machines, the same kernels must sum the same
numbers in the same order. Three things break that on CUDA, each fixed at its own time:

- torch's kernels: some accumulate with atomics (index_add, scatter, the embedding
  backward...), whose order changes from launch to launch. `use_deterministic_algorithms`
  picks an ordered kernel where torch has one and raises where it has none (the run then
  stops naming the operation, errors.refused_by_determinism). cuDNN: its autotuner
  (`benchmark`) may choose another algorithm each run, and some algorithms are atomic.
- cuBLAS: with its default workspace, a matmul may split its reduction differently when
  streams share the workspace. `CUBLAS_WORKSPACE_CONFIG` fixes it, but cuBLAS reads it once,
  when torch first creates a handle: it must be in the environment before any CUDA work.
- NCCL: the all-reduce's algorithm (ring, tree, NVLS, CollNet) is chosen per message size
  and topology, and each sums in its own order. `NCCL_ALGO` is read once, when the
  communicator is created (`init_process_group` with a device id, in `distributed_run`).

So every worker sets the environment itself, first thing in `train`, before
`distributed_run` starts the device or the group: under torchrun, under the CLI's own
`--nproc-per-node` launcher and in one process alike, and no launcher needs to know the
recipe (`resume DIR --nproc-per-node N` has not even read it when it starts the workers).

What is pinned, and why (the choice between torchtitan's and Megatron's):

- `NCCL_ALGO=Ring`, as Megatron-LM's `--deterministic-mode` sets it. A ring sums each
  element in the order of the ranks around it, which the topology fixes; a tree's order
  within a node is not user-controllable, and NVLS / CollNet reduce in the switch. Megatron
  measured Ring bit-exact across runs within one allocation, and says plainly that it is not
  across allocations whose ring differs: that is our claim too (same machines).
- Not `NCCL_PROTO=Simple` nor one channel: torchtitan pins those (with `allreduce:tree` and
  one NCCL thread) only in its batch-invariant mode, which aims at results independent of the
  batch's composition and of the allocation, a stronger goal than ours. Its plain
  `debug.deterministic` sets no NCCL variable at all. The protocol and channel count decide
  how a buffer is cut into chunks; NCCL derives them from the message size and the topology,
  which a rerun or a resume on the same machines repeats, so pinning them buys nothing here
  and costs small-message latency (Simple) or bandwidth (one channel).
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` (both projects): 8 buffers of 4 MiB per stream;
  `:16:8` is the other deterministic value (less memory, slower).

A value the user already set is never overwritten: `CUBLAS_WORKSPACE_CONFIG` must then be
one of the two deterministic values (anything else is refused, exit 2, as Megatron does; torch
itself would refuse it only at the first matmul); `NCCL_ALGO` is the user's to choose (a
cluster may need `^NVLS`, say) and is kept, with a note saying that the order of the sums is
then as fixed as that choice makes it.

`trainer.deterministic: false` sets nothing: torch's defaults, or the program's own
settings, apply. The settings last as long as the run: when `fit()` returns (or fails), a
program's process has its own flags and variables back (`applied`). On CPU the flags change
nothing measurable: torch's CPU kernels already sum in a fixed order (the few without a
deterministic implementation, such as max_unpool, are refused as on CUDA), gloo too, and
nothing reads the variables.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping

import torch

from embodichain.core.errors import UsageError

KEY = "trainer.deterministic"
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
DETERMINISTIC_WORKSPACES = (":4096:8", ":16:8")  # what torch accepts under its flag
# What every worker's environment gets, unless the user set the variable already.
ENVIRONMENT = {CUBLAS_WORKSPACE: ":4096:8", "NCCL_ALGO": "Ring"}


def set_environment(deterministic: bool,
                    env: MutableMapping[str, str] | None = None) -> list[str]:
    """Put the deterministic settings of `ENVIRONMENT` into `env` (this process's
    environment by default) where unset; returns a note for each user value kept.

    Raises UsageError (exit 2) for a `CUBLAS_WORKSPACE_CONFIG` that is not deterministic.
    Call it before anything starts CUDA or NCCL: both read these variables once.
    """
    env = os.environ if env is None else env
    if not deterministic:
        return []
    workspace = env.get(CUBLAS_WORKSPACE) or None
    if workspace is not None and workspace not in DETERMINISTIC_WORKSPACES:
        raise UsageError(
            f"{KEY}: true needs a deterministic cuBLAS workspace, but the environment sets "
            f"{CUBLAS_WORKSPACE}={workspace}; unset it (embodichain then sets "
            f"{ENVIRONMENT[CUBLAS_WORKSPACE]}) or set {' or '.join(DETERMINISTIC_WORKSPACES)}. "
            "Nothing was started.")
    notes = []
    for name, value in ENVIRONMENT.items():
        if not env.get(name):
            env[name] = value
        elif env[name] != value:
            notes.append(f"{KEY}: keeping {name}={env[name]} from the environment (unset, it "
                         f"would be {value}); results repeat as far as that setting does")
    return notes


@contextlib.contextmanager
def applied(deterministic: bool) -> Iterator[list[str]]:
    """`apply` for the length of a block (a run); afterwards torch's flags and the variables
    are as they were, so a program that goes on after `fit()` is not left deterministic.
    Yields the notes of `set_environment`."""
    flags = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    variables = {name: os.environ.get(name) for name in ENVIRONMENT}
    try:
        yield apply(deterministic)
    finally:
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2:]
        for name, value in variables.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def apply(deterministic: bool) -> list[str]:
    """`set_environment`, then torch's flags: deterministic kernels only, cuDNN deterministic
    and without its autotuner. Idempotent; nothing is changed when `deterministic` is false.
    Returns the notes of `set_environment`."""
    notes = set_environment(deterministic)
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return notes
