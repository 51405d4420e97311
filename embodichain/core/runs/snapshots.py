"""Which snapshot a run directory means: the newest complete one, by step and
digest-verified (R-RESUME-8), and the recipe stored with a run (R-RESUME-6).

`newest_snapshot` is the one answer to "which snapshot": `resume` continues from it,
`inspect-checkpoint DIR` and `export DIR` read it, and the `runs` table, the end-of-run
summary and the messages of a stopped run name it (those without verifying digests:
`verify=False` reads each candidate's manifest only, without torch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.formats import problems_here
from embodichain.core.checkpoint.manifest import read_manifest
from embodichain.core.checkpoint.names import LAST, step_files
from embodichain.core.errors import CheckpointError, RefusedError
from embodichain.core.runs.elastic import without_derived_keys
from embodichain.core.runs.run_dir import RUN_JSON, read_run_json


@dataclass(frozen=True)
class Snapshot:
    """A checkpoint chosen to continue from. `note` says why it is not last.pt; `damaged`
    lists newer snapshot files that failed verification. `data` is the whole verified
    checkpoint, or only `{"manifest": ...}` when chosen with `verify=False`."""

    path: Path
    data: dict[str, Any]
    note: str | None = None
    damaged: tuple[Path, ...] = ()
    files: tuple[tuple[str, int, int], ...] = ()  # the snapshot files when it was chosen

    @property
    def step(self) -> int:
        return int(self.data["manifest"]["step"])

    @property
    def run(self) -> dict[str, Any]:
        return self.data["payload"]["run"]


# What is wrong with the parts of a checkpoint (path, verified data): [] when they verify.
PartsProblems = Callable[[Path, Mapping[str, Any]], list[str]]


@dataclass(frozen=True)
class PartChecks:
    """How the parts a checkpoint keeps beside its file (an FSDP manifest's shards) are
    judged: `here` by this node (default: as the file's own format says, formats.py), then
    `elsewhere` by the nodes of this world that hold the others (launch/start asks them, a
    collective). A resume passes its strategy's checkpoint format."""

    here: PartsProblems = problems_here
    elsewhere: PartsProblems | None = None

    def problems(self, path: Path, data: Mapping[str, Any]) -> list[str]:
        found = self.here(path, data)
        if not found and self.elsewhere is not None:
            found = self.elsewhere(path, data)
        return found


def newest_snapshot(directory: Path, *, verify: bool = True,
                    parts: PartChecks | None = None) -> Snapshot | None:
    """The newest complete snapshot of a run directory: by step, digest-verified (R-RESUME-8).

    last.pt is normally the newest (it is published before the step file of the same
    update); when it is missing or damaged, the newest `step_N.pt` that verifies is used and
    the note says so. A sharded manifest verifies when its shards on this node do (each
    shard's digest against the manifest's record of it) and, with `elsewhere`, those on
    other nodes too (asked only of a manifest complete here, newest first, so each node
    reads one shard per candidate until one is complete; `parts` says how). None when the run
    never saved a
    snapshot; RefusedError when it saved some and none verifies. `verify=False` takes a
    file whose manifest reads as complete (no digest check, no torch): the choice `resume`
    makes unless a file is damaged inside.
    """
    def read(path: Path) -> dict[str, Any]:
        return _read_verified(path, parts or PartChecks()) if verify else _read_manifest(path)

    problems: list[str] = []
    damaged: list[Path] = []
    best: Snapshot | None = None
    files = snapshot_files(directory)
    if (directory / LAST).exists():
        try:
            best = Snapshot(directory / LAST, read(directory / LAST))
        except CheckpointError as exc:
            problems.append(f"{LAST} is damaged ({exc})")
            damaged.append(directory / LAST)
    for step, path in reversed(step_files(directory)):
        if best is not None and step <= best.step:
            break
        try:
            best = Snapshot(path, read(path))
        except CheckpointError as exc:
            problems.append(f"{path.name} is damaged ({exc})")
            damaged.append(path)
            continue
        if not problems and best.step > 0:
            problems.append(f"{LAST} is missing")
        break
    if best is None:
        if problems:
            raise RefusedError(f"no snapshot in {directory} verifies: " + "; ".join(problems)
                               + ". Nothing was changed.")
        return None
    if not problems:
        return replace(best, files=files)
    note = "; ".join(problems) + f"; continuing from {best.path.name} (update {best.step}), " \
        "the newest snapshot that verifies"
    return Snapshot(best.path, best.data, note, tuple(damaged), files)


def newest_snapshot_path(directory: Path) -> Path | None:
    """The snapshot `resume` would continue from, for a message (manifests only, never
    raises): None when the run saved none that reads."""
    try:
        snapshot = newest_snapshot(directory, verify=False)
    except RefusedError:
        return None
    return snapshot.path if snapshot is not None else None


def where_to_continue(directory: Path) -> str:
    """Which snapshot a failed run can continue from, as this rank sees the directory."""
    if not directory.is_dir():  # another node: only rank 0 sees the run directory
        return "rank 0's run directory holds the last snapshot"
    snapshot = newest_snapshot_path(directory)
    return (f"the last snapshot is {snapshot}" if snapshot is not None
            else f"no snapshot was saved in {directory} yet")


def _read_verified(path: Path, parts: PartChecks) -> dict[str, Any]:
    """The verified checkpoint at `path`; one that keeps parts beside it (a sharded
    manifest) is complete only when its parts verify too (`parts`: those this node holds
    or sees, then those the other nodes report on), so that a run whose last.pt names a
    missing or damaged shard continues from its newest complete step file instead."""
    from embodichain.core.checkpoint.file import read_checkpoint  # torch

    data = read_checkpoint(path)
    problems = parts.problems(path, data)
    if problems:
        raise CheckpointError("; ".join(problems))
    return data


def _read_manifest(path: Path) -> dict[str, Any]:
    manifest = read_manifest(path)
    if manifest is None:
        raise CheckpointError(f"{path} is not a readable checkpoint")
    return {"manifest": manifest}


def snapshot_files(directory: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of last.pt and every step file: what changes when
    anyone saves in the directory."""
    found = []
    for path in [directory / LAST, *(p for _, p in step_files(directory))]:
        try:
            info = path.stat()
        except OSError:
            continue
        found.append((path.name, info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


@dataclass(frozen=True)
class StoredRecipe:
    """What `resume RUN_DIR` continues with: the recipe stored with the run, where it came
    from, and the snapshot it continues from (None: the run never saved one)."""

    config: dict[str, Any]
    source: str
    snapshot: Snapshot | None


def stored_recipe(directory: Path, parts: PartChecks | None = None) -> StoredRecipe:
    """The recipe of the run in `directory`: its newest snapshot's, else run.json's."""
    if not directory.is_dir():
        raise RefusedError(f"{directory} is not a run directory"
                           + (" (it is a file)" if directory.exists() else
                              " (no such directory)"))
    snapshot = newest_snapshot(directory, parts=parts)
    if snapshot is not None:  # under G, launched again on any world size (elastic.py)
        return StoredRecipe(without_derived_keys(snapshot.run["config"]),
                            f"{snapshot.path} (stored recipe)", snapshot)
    stored = read_run_json(directory)  # it never saved: restart from 0 with its recipe
    if stored is None or not isinstance(stored.get("config"), dict):
        raise RefusedError(f"{directory} holds no snapshot and no {RUN_JSON} with a recipe; "
                           "it is not a run that can be continued")
    return StoredRecipe(without_derived_keys(stored["config"]),
                        f"{directory / RUN_JSON} (stored recipe)", None)
