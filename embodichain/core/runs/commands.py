"""The commands that continue a run the way it was launched: in one process, self-launched
(`--nproc-per-node`) or under torchrun on one node or several. Every message that says how
to continue builds its command here, keeping the user's own `--set` options (a pasted
suggestion must aim at the same run, with the same changes)."""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

SELF_LAUNCHED = "EMBODICHAIN_SELF_LAUNCHED"  # set for workers started by --nproc-per-node

_USER_OVERRIDES: list[str] = []  # this command's `--set KEY=VALUE`, as the user gave them


@contextlib.contextmanager
def keep_user_overrides(overrides: Sequence[str]) -> Iterator[None]:
    """While a command runs: its `--set` values, for every command a message suggests
    (forgotten after it, so that a program's next command does not inherit them)."""
    before = list(_USER_OVERRIDES)
    _USER_OVERRIDES[:] = list(overrides)
    try:
        yield
    finally:
        _USER_OVERRIDES[:] = before


def with_user_overrides(args: str) -> str:
    """`args` followed by the user's `--set` options, each but those whose key `args`
    already sets itself (a suggestion's own value, e.g. a fresh output_dir, wins)."""
    # `resume RUN_DIR` trains in RUN_DIR whatever trainer.output_dir says: not repeated.
    mine = {"trainer.output_dir"} if args.startswith("resume ") else set()
    kept = [o for o in _USER_OVERRIDES
            if f"--set {(key := o.partition('=')[0].strip())}=" not in args
            and key not in mine]
    return " ".join([args, *(f"--set {shlex.quote(o)}" for o in kept)])


def command_for(args: str, world_size: int | None) -> str:
    """`embodichain ARGS` as this run's workers must be started again: in one process, or
    the way this run was launched (self-launch, torchrun on one node or on several).

    `world_size` is the run's, which may differ from this launch's (a refused resume names
    the launch that fits the run, not the one that was refused).
    """
    args = with_user_overrides(args)
    if not world_size or world_size <= 1:
        return f"embodichain {args}"
    if os.environ.get(SELF_LAUNCHED):
        return f"embodichain {args} --nproc-per-node {world_size}"
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1)
    if nodes > 1:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if nodes * per_node != world_size:  # this launch does not fit the run
            return (f"torchrun with --nnodes x --nproc-per-node = {world_size} workers (and "
                    f"this job's rendezvous options, on every node) -m embodichain {args}")
        return (f"torchrun --nnodes={nodes} --nproc-per-node={per_node} (and this job's "
                f"rendezvous options, on every node) -m embodichain {args}")
    return (f"OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node={world_size} "
            f"-m embodichain {args}")


def resume_command(directory: Path | str, world_size: int | None) -> str:
    """The exact command that continues `directory` in place with `world_size` workers."""
    return command_for(f"resume {directory}", world_size)


def fresh_command(checkpoint: Path, directory: Path, recipe: str | None = None,
                  world_size: int | None = None) -> str:
    """The command that resumes `checkpoint` (of `world_size` workers) into a fresh directory
    beside `directory`."""
    return command_for(f"train-sl --config {recipe or 'RECIPE.yaml'} --resume {checkpoint} "
                       f"--set trainer.output_dir={directory}_resumed", world_size)
