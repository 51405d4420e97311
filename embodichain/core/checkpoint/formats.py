"""What a checkpoint keeps beside its file, as resume-time checks ask it (R-STRAT-1, R-PREEMPT-2).

A checkpoint is either one file (`SingleFile`, core/checkpoint/single_file.py: DDP writes
everything into it) or a manifest whose parts (each rank's shard) are files of their own,
possibly on other nodes (`Sharded`, core/checkpoint/shard_format.py). Each strategy owns the
format it writes (`Strategy.checkpoint_format`); the run directory's rules (core/runs) and
the start-up (core/launch) ask that object, never the sharded format itself: which parts a
checkpoint has, which of them this node sees, whether they verify, and the payload to
restore. `format_of` names the format a file is written in, for readers without a strategy
(inspect-checkpoint, export, `--init-from`, `resume RUN_DIR` choosing its snapshot).
Torch-free at import (the `runs` table reads snapshots' manifests without torch): the
sharded format's files, which need torch, are read where a method needs them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.shard_format import SHARDED
from embodichain.core.checkpoint.single_file import SINGLE_FILE, SingleFile
from embodichain.core.errors import CheckpointError

CheckpointFormat = SingleFile  # the interface: a format keeping no parts is the base case
__all__ = ["SHARDED", "SINGLE_FILE", "CheckpointFormat", "check_rank_entries", "format_of",
           "problems_here", "this_node"]


def format_of(data: Mapping[str, Any]) -> SingleFile:
    """The format a verified checkpoint dict is written in: the one that recognises it
    (each format knows its own files: `holds`), else one file."""
    return SHARDED if SHARDED.holds(data) else SINGLE_FILE


def problems_here(path: Path, data: Mapping[str, Any]) -> list[str]:
    """What this node finds wrong with the parts of the checkpoint at `path`, whatever its
    format (for readers without a strategy: inspect, export, choosing a snapshot)."""
    return format_of(data).problems_here(data, path)


def this_node() -> list[Any]:
    """Where this process runs, as a part's record names it: host and torchrun node rank."""
    return [socket.gethostname(), int(os.environ.get("GROUP_RANK", "0") or 0)]


def check_rank_entries(data: Mapping[str, Any], path: Path | str) -> None:
    """Exactly one state per rank 0..world_size-1 (R-CKPT-5): none missing, none extra.

    Checked before restoring (not on every read, so `inspect-checkpoint` can still show
    what such a file holds).
    """
    ranks = format_of(data).rank_entries(data)
    world_size = data["manifest"].get("world_size")
    if not isinstance(ranks, dict) or not isinstance(world_size, int):
        raise CheckpointError(f"{path} holds no per-rank state table; it cannot be restored")
    expected = set(range(world_size))
    missing = sorted(expected - set(ranks))
    extra = sorted((r for r in ranks if r not in expected), key=str)
    if missing or extra:
        found = ", ".join(map(str, sorted(ranks, key=str))) or "none"
        problems = ([f"missing rank {', '.join(map(str, missing))}"] if missing else []) + \
                   ([f"unexpected entry {', '.join(map(str, extra))}"] if extra else [])
        raise CheckpointError(
            f"{path} was written by {world_size} worker(s) but holds per-rank state for "
            f"rank(s) {found} ({'; '.join(problems)}); every rank needs exactly its own entry, "
            "so it cannot be restored")
