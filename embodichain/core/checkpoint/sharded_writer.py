"""Writing sharded checkpoints: every rank its own shard, in parallel; rank 0 the manifest,
once every shard is durable (R-SHARD-2, with R-CKPT-2/8 kept).

A `ShardSave` is the job each rank hands its `CheckpointWriter` (writer.py): at a save
boundary each rank copies its shard into reused CPU buffers (the only pause of training, as
for a gathered save) and the writer's thread of each rank then digests, serialises and
fsyncs it. The threads then meet in a collective of their own (a separate gloo group, so
they never interleave with training's collectives on the default group): rank 0 learns
every shard's digest or failure, writes the manifest atomically (or records the failure),
and tells every rank the outcome and which shard files the published manifests still name.
Each rank then deletes its own shards that no manifest names (saves cut short by a kill,
checkpoints removed by `keep_last`): on several machines without a shared filesystem, each
node so cleans its own copy of the run directory.

Every rank learns a failure in the same collective, so every rank stops at the same next
boundary (the trainer's usual `failure` check), naming the shard and host that failed.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.distributed as dist

from embodichain.core.checkpoint.file import read_checkpoint, write_checkpoint
from embodichain.core.checkpoint.names import BEST, LAST, step_files
from embodichain.core.checkpoint.sharded import (
    SHARDS_DIR,
    is_sharded_checkpoint,
    manifest_checkpoint,
    shard_checkpoint,
    shard_entry,
    shard_table,
)
from embodichain.core.checkpoint.writer import SaveFailure, StagingArea, failure_reason
from embodichain.core.errors import CheckpointError
from embodichain.core.file_hash import file_sha256


class ShardedSaveFailure(SaveFailure):
    """A sharded save that failed: on any rank (its reason names the rank and host)."""

    @property
    def what(self) -> str:
        return f"saving sharded checkpoint {self.path} failed"


def save_group() -> Any:
    """The process group of sharded saves (created on every rank at the same point, as
    `new_group` requires; None in one process): the writers' threads meet in it, never in
    the default group that training uses."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


def release_save_group(group: Any) -> None:
    """Free a `save_group` (after the save in flight, before the default group goes)."""
    if group is not None:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(group)


class ShardSave:
    """One rank's part of one sharded save (a `SaveJob` of checkpoint/writer.py): its shard,
    then, on rank 0, the manifest once every shard is durable. Every rank runs it, inline
    or on its writer's thread, and all meet in `group`."""

    def __init__(self, directory: Path, relpath: str, run: Mapping[str, Any],
                 shard: dict[str, Any], manifest: dict[str, Any] | None, path: Path, *,
                 also_as: Path | None = None,
                 before_publish: Callable[[], None] | None = None,
                 after_publish: Callable[[], None] | None = None, group: Any = None) -> None:
        """`manifest`: rank 0's payload without shards (None on the other ranks)."""
        self.directory, self.relpath, self.identity = directory, relpath, dict(run)
        self.shard, self.manifest, self.path, self.also_as = shard, manifest, path, also_as
        self.before_publish, self.after_publish = before_publish, after_publish
        self.group = group
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.staging_error: str | None = None

    def stage(self, staging: StagingArea) -> None:
        self.shard = staging.copy(self.shard)
        self.manifest = staging.copy(self.manifest) if self.manifest is not None else None

    def staging_failed(self, reason: str) -> None:
        self.staging_error = reason  # still meets the others, to tell them

    def run(self) -> SaveFailure | None:
        try:
            return self._run()
        except BaseException as exc:  # a broken collective: kept for the training thread
            return ShardedSaveFailure(self.path, failure_reason(exc, self.path))

    def _run(self) -> SaveFailure | None:
        mine = self._write_shard()
        entries = self._gather(mine)
        outcome: dict[str, Any] = {"failure": None, "live": None}
        if self.rank == 0:
            outcome = self._publish(entries)
        outcome = self._broadcast(outcome)
        if outcome["live"] is not None:
            self._remove_unnamed_shards(set(outcome["live"]))
        if outcome["failure"] is not None:
            return ShardedSaveFailure(self.path, outcome["failure"])
        return None

    def _write_shard(self) -> dict[str, Any]:
        target = self.directory / self.relpath
        if self.staging_error is not None:
            return {"error": f"{self.staging_error} (copying the shard of rank {self.rank})"}
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            checkpoint = shard_checkpoint(self.identity, self.rank, self.shard)
            write_checkpoint(checkpoint, target)
            return shard_entry(checkpoint, self.relpath, target.stat().st_size,
                               file_sha256(target))
        except Exception as exc:
            return {"error": f"{failure_reason(exc, target)} (shard of rank {self.rank} on "
                             f"host {socket.gethostname()})"}

    def _gather(self, mine: dict[str, Any]) -> list[dict[str, Any]] | None:
        if self.group is None:
            return [mine]
        out: list[Any] | None = [None] * dist.get_world_size(self.group) if self.rank == 0 \
            else None
        dist.gather_object(mine, out, dst=0, group=self.group)
        return out

    def _publish(self, entries: list[dict[str, Any]] | None) -> dict[str, Any]:
        assert entries is not None and self.manifest is not None
        errors = [e["error"] for e in entries if "error" in e]
        if errors:
            return {"failure": "; ".join(errors), "live": None}
        try:
            checkpoint = manifest_checkpoint(self.manifest, dict(enumerate(entries)))
            if self.before_publish is not None:
                self.before_publish()
            write_checkpoint(checkpoint, self.path, also_as=self.also_as)
            if self.after_publish is not None:
                self.after_publish()
        except Exception as exc:
            return {"failure": failure_reason(exc, self.path), "live": None}
        return {"failure": None, "live": sorted(named_shards(self.path.parent))}

    def _broadcast(self, outcome: dict[str, Any]) -> dict[str, Any]:
        if self.group is None:
            return outcome
        box = [outcome]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _remove_unnamed_shards(self, live: set[str]) -> None:
        """Delete this rank's shard files that no published manifest names."""
        shards = self.directory / SHARDS_DIR
        for path in shards.glob(f"step_*.rank_{self.rank}.pt"):
            relpath = f"{SHARDS_DIR}/{path.name}"
            if relpath not in live and relpath != self.relpath:
                with contextlib.suppress(OSError):
                    path.unlink()


def named_shards(directory: Path) -> set[str]:
    """The shard files that the manifests in `directory` name (unreadable ones name none)."""
    names: set[str] = set()
    manifests = [directory / LAST, directory / BEST, *(p for _, p in step_files(directory))]
    for path in manifests:
        if not path.is_file():
            continue
        try:
            data = read_checkpoint(path)
        except CheckpointError:
            continue
        if is_sharded_checkpoint(data):
            names.update(entry["file"] for entry in shard_table(data).values())
    return names
