"""What the commands that start workers share (`train-sl`, `resume`, `eval`): the launch
options and the self-launch (R-LAUNCH-1)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Annotated

import typer

NoProgressOpt = Annotated[bool, typer.Option("--no-progress",
                                             help="No progress bar or periodic log lines.")]
NprocOpt = Annotated[int | None, typer.Option(
    "--nproc-per-node", metavar="N", help="Start N workers on this machine through torch's "
    "elastic launcher, as `torchrun --standalone --nproc-per-node=N` would (ignored under "
    "torchrun).")]
MaxRestartsOpt = Annotated[int, typer.Option(
    "--max-restarts", metavar="M", help="With --nproc-per-node: restart all workers up to M "
    "times after a failure (combine with --resume auto).")]


def local_ranks(nproc_per_node: int | None) -> int:
    """The training processes this node will run: --nproc-per-node when self-launching,
    else torchrun's LOCAL_WORLD_SIZE (1 alone)."""
    from embodichain.core.launch.self_launch import should_launch

    if should_launch(nproc_per_node) and nproc_per_node:
        return nproc_per_node
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def launch_if_asked(nproc_per_node: int | None, max_restarts: int,
                     worker_args: Callable[[], list[str]]) -> None:
    """Self-launch (R-LAUNCH-1): hand over to N workers running `worker_args()` (this command,
    rebuilt from its parsed values, without the launch options) and exit with the
    launcher's code."""
    from embodichain.core.errors import UsageError
    from embodichain.core.launch.self_launch import launch, should_launch

    if should_launch(nproc_per_node):
        raise typer.Exit(launch(nproc_per_node or 1, max_restarts, worker_args()))
    if max_restarts and nproc_per_node is None:
        raise UsageError("--max-restarts needs --nproc-per-node N (under torchrun, give "
                         "--max-restarts to torchrun itself)")
