"""What a checkpoint keeps beside its file, as resume-time checks ask it (R-STRAT-1, R-PREEMPT-2).

A checkpoint is either one file (`SingleFile`: DDP writes everything into it) or a manifest
whose parts (each rank's shard) are files of their own, possibly on other nodes (`Sharded`,
core/checkpoint/sharded.py). Each strategy owns the format it writes
(`Strategy.checkpoint_format`); the run directory's rules (core/runs) and the start-up
(core/launch) ask that object, never the sharded format itself: which parts a checkpoint
has, which of them this node sees, whether they verify, and the payload to restore.
`format_of` names the format a file is written in, for readers without a strategy
(inspect-checkpoint, export, `resume RUN_DIR` choosing its snapshot). Torch-free at import
(the `runs` table reads snapshots' manifests without torch): the sharded format, which
needs torch, is imported where it is used.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from embodichain.core.errors import CheckpointError


class SingleFile:
    """Everything in the one file: no parts, nothing to judge beyond the file's digest."""

    written_by = "ddp"  # the strategy writing this format (reports name it)
    keeps_parts = False  # whether parts are files beside the checkpoint's own

    def rank_entries(self, data: Mapping[str, Any]) -> Any:
        """The per-rank table a restore needs one entry of per rank (None: there is none)."""
        return data["payload"].get("ranks")

    def parts(self, data: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        """The parts kept beside the file, by part number (an old rank): file, host, node."""
        return {}

    def parts_seen(self, data: Mapping[str, Any], path: Path) -> list[int]:
        """The parts whose file this node sees at the checkpoint's side."""
        return []

    def problems_here(self, data: Mapping[str, Any], path: Path) -> list[str]:
        """What is wrong with the parts this node can judge ([]: none)."""
        return []

    def parts_elsewhere(self, data: Mapping[str, Any], path: Path) -> list[int]:
        """The parts this node cannot judge: written on another node and absent here."""
        return []

    def check_part(self, directory: Path, data: Mapping[str, Any], part: int) -> str | None:
        """None when part `part` (at `directory`) verifies, else what is wrong (one line)."""
        return None

    def payload_to_restore(self, data: Mapping[str, Any], path: Path) -> dict[str, Any]:
        """A verified checkpoint's payload, as the strategy restores from it."""
        return dict(data["payload"])

    def describe_part(self, data: Mapping[str, Any], path: Path, part: int) -> str:
        """A part named for a message: its file and where it was written."""
        return f"part {part} of {path}"

    def unreachable(self, data: Mapping[str, Any], path: Path, part: int,
                    nodes: list[list[Any]]) -> str:
        """Why no node of this world (`nodes`: host and node rank each) can give part `part`:
        missing on the node that wrote it, or written on a node outside this world."""
        return f"{self.describe_part(data, path, part)} is on no node of this world"


class Sharded(SingleFile):
    """A manifest and one shard file per old rank (`trainer.strategy: fsdp`)."""

    written_by = "fsdp"
    keeps_parts = True

    def rank_entries(self, data: Mapping[str, Any]) -> Any:
        table = data["payload"].get("sharded")  # one shard file per rank
        return table.get("shards") if isinstance(table, Mapping) else None

    def parts(self, data: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        return _sharded().shard_table(data) if _is_sharded(data) else {}

    def parts_seen(self, data: Mapping[str, Any], path: Path) -> list[int]:
        return sorted(k for k, e in self.parts(data).items()
                      if (Path(path).parent / e["file"]).is_file())

    def problems_here(self, data: Mapping[str, Any], path: Path) -> list[str]:
        return _sharded().shard_problems_here(data, path)

    def parts_elsewhere(self, data: Mapping[str, Any], path: Path) -> list[int]:
        return _sharded().shards_elsewhere(data, path)

    def check_part(self, directory: Path, data: Mapping[str, Any], part: int) -> str | None:
        return _sharded().check_shard(directory, data, part)

    def payload_to_restore(self, data: Mapping[str, Any], path: Path) -> dict[str, Any]:
        return _sharded().payload_to_restore(data, path)

    def describe_part(self, data: Mapping[str, Any], path: Path, part: int) -> str:
        entry = self.parts(data).get(part, {})
        return (f"the shard of rank {part} ({Path(path).parent / entry.get('file', '?')}, "
                f"written on host {entry.get('host')}, node {entry.get('node', 0)})")

    def unreachable(self, data: Mapping[str, Any], path: Path, part: int,
                    nodes: list[list[Any]]) -> str:
        entry = self.parts(data).get(part, {})
        file, host = Path(path).parent / entry.get("file", "?"), entry.get("host")
        if [host, entry.get("node", 0)] in [list(n) for n in nodes]:
            return f"shard of rank {part} is missing: {file} (written on host {host})"
        shown = ", ".join(f"{h} node {n}" for h, n in nodes)
        return (f"shard of rank {part} ({file}, written on host {host}, node "
                f"{entry.get('node', 0)}) is not reachable from any node of this world "
                f"({shown}): put it at that path on one of them (or on a shared filesystem)")


SINGLE_FILE = SingleFile()
SHARDED = Sharded()
CheckpointFormat = SingleFile  # the interface: a format keeping no parts is the base case


def format_of(data: Mapping[str, Any]) -> SingleFile:
    """The format a verified checkpoint dict is written in."""
    return SHARDED if _is_sharded(data) else SINGLE_FILE


def problems_here(path: Path, data: Mapping[str, Any]) -> list[str]:
    """What this node finds wrong with the parts of the checkpoint at `path`, whatever its
    format (for readers without a strategy: inspect, export, choosing a snapshot)."""
    return format_of(data).problems_here(data, path)


def this_node() -> list[Any]:
    """Where this process runs, as a part's record names it: host and torchrun node rank."""
    return [socket.gethostname(), int(os.environ.get("GROUP_RANK", "0") or 0)]


def _sharded() -> ModuleType:
    from embodichain.core.checkpoint import sharded  # torch

    return sharded


def _is_sharded(data: Mapping[str, Any]) -> bool:
    return isinstance(data.get("payload"), Mapping) and "sharded" in data["payload"]


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
