"""What a resume records in the run directory, written only once every rank has loaded its
state (R-PREEMPT-2): the roll-back of metrics beyond the snapshot (R-RESUME-6), the `resumed`
event (with the package versions it runs with), a world-size change (R-ELASTIC-3), the keys
added to the stored recipe at their defaults and the data locations that moved (R-PREEMPT-3).

Rank 0 decides all of it while choosing the snapshot (resume_policy), writing nothing; the
start-up (core/launch/start.py) runs `commit` after every rank reported its state loaded.
A resume that fails to load leaves run.json, metrics.jsonl and the lock as they were.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from embodichain.core.recipe.data_location import with_values
from embodichain.core.recipe.schema import config_sha256
from embodichain.core.runs.config_compat import with_keys
from embodichain.core.runs.fresh_claim import ClaimSite
from embodichain.core.runs.roll_back import roll_back
from embodichain.core.runs.run_dir import (
    TORN_METRICS,
    move_torn_tail,
    now_iso,
    remove_stale_temp_files,
    update_run_json,
)
from embodichain.core.runs.run_end import RUN_JSON_FORMAT, records_clean_stops


@dataclass
class Committed:
    """What the commit did: lines to tell the user, and a fresh claim (resume into a fresh
    directory) for runs/fresh_claim to give back if the run then does no update."""

    notes: list[str] = field(default_factory=list)
    claimed: ClaimSite | None = None


Commit = Callable[[], Committed]


def added_note(added: Mapping[str, Any]) -> str:
    """`added since this checkpoint: model.activation = relu (the default), ...`."""
    return "added since this checkpoint: " + ", ".join(
        f"{key} = {_shown(value)} (the default)" for key, value in sorted(added.items()))


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def moved_note(moves: Mapping[str, tuple[Any, Any]]) -> str:
    """`the data moved (same source identity): data.root: /a -> /b`."""
    return "the data moved (its source identity is the checkpoint's): " + "; ".join(
        f"{key}: {old} -> {new}" for key, (old, new) in sorted(moves.items()))


@dataclass
class InPlaceRecord:
    """The records of a resume in the run's own directory (`resume RUN_DIR`, `--resume
    auto`, `--resume CKPT` into its own directory), decided but not yet written."""

    directory: Path
    step: int
    resumed: dict[str, Any]  # the `resumed` event, without its time
    change: dict[str, int] | None = None  # a world-size change
    added: dict[str, Any] = field(default_factory=dict)  # keys added at their defaults
    moves: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # data locations
    damaged: tuple[Path, ...] = ()  # newer snapshots that failed verification

    def commit(self) -> Committed:
        """Write it all (rank 0, holding the run lock); the lines to tell the user."""
        directory, events, notes = self.directory, [], []
        removed = remove_stale_temp_files(directory)
        if removed:
            notes.append(f"removed {len(removed)} temporary file(s) left by an interrupted "
                         "save")
        if self.damaged:
            # The new history will save under these names: keep the damaged files for a look.
            aside = [_set_aside(path) for path in self.damaged]
            events.append({"event": "damaged_snapshots_set_aside", "at": now_iso(),
                           "files": [p.name for p in aside]})
        torn = move_torn_tail(directory)  # first: a torn line is no record to roll back
        rolled = roll_back(directory, self.step, events)  # records its event (and `events`)
        if rolled is not None:
            notes.append(f"rolled back {rolled['records']} metrics record(s) of updates "
                         f"{rolled['first_step']}..{rolled['last_step']} beyond the snapshot "
                         f"at update {self.step}: moved to {directory / rolled['moved_to']}")
        resumed = {"event": "resumed", "at": now_iso(), **self.resumed}
        if torn is not None:
            resumed["torn_metrics_line_moved_to"] = TORN_METRICS
        events.append(resumed)
        update_run_json(directory, self._record(events))
        return Committed(notes)

    def _record(self, events: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
        change, added, moves = self.change, self.added, self.moves

        def record(data: dict[str, Any]) -> None:
            data.setdefault("events", []).extend(events)
            # From this resume on, a clean stop is recorded (run_end): its absence says
            # something.
            if not records_clean_stops(data):
                data["format_version"] = RUN_JSON_FORMAT
            if change is not None:  # every continuation on another world size
                data["world_size_changes"] = [*data.get("world_size_changes", []), change]
                data["world_size"] = change["to"]
            if added or moves:  # the stored recipe: the keys it lacked, where the data is now
                config = with_keys(data.get("config") or {}, added)
                data["config"] = with_values(config, {k: new for k, (_, new) in moves.items()})
                data["config_sha256"] = config_sha256(data["config"])

        return record


def _set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint to a name that is not `*.pt` and is not taken."""
    target = path.with_name(path.name + ".damaged")
    k = 1
    while target.exists():
        k += 1
        target = path.with_name(f"{path.name}.damaged{k}")
    os.replace(path, target)
    return target
