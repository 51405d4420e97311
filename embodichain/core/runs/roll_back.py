"""Roll-back (R-RESUME-6): metrics records beyond the snapshot a run continues from move
to a side file, named by a `rolled_back` event in run.json that is recorded first."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.file import fsync_directory
from embodichain.core.runs.run_dir import METRICS, now_iso, read_run_json, update_run_json


def roll_back(directory: Path, step: int, unrecorded: list[dict[str, Any]] | None = None
              ) -> dict[str, Any] | None:
    """Move metrics records beyond `step` out of metrics.jsonl (R-RESUME-6).

    The records go to a side file `metrics.rolled_back.K.jsonl`, never deleted. The
    `rolled_back` event that names it (with its record count) is written to run.json before
    anything moves, together with (before it) the caller's `unrecorded` events, which the list
    then no longer holds. So a kill at any point leaves no side file that no event names:

    - before the event is recorded: nothing has changed;
    - after it: metrics.jsonl still holds every record until the side file is complete and
      durable, and is then replaced in one rename. An event not yet followed by its `resumed`
      event is such an interrupted roll-back, and this call finishes it first
      (`_finish_roll_back`): the move is redone from metrics.jsonl, overwriting whatever the
      side file held, or found done. Nothing is counted twice or lost.

    Returns the event describing the records beyond `step` (already in run.json), or None
    when none were beyond `step`.
    """
    unrecorded = unrecorded if unrecorded is not None else []
    events = (read_run_json(directory) or {}).get("events") or []
    pending = _interrupted_roll_back(events)
    if pending is not None:
        _finish_roll_back(directory, pending)
    path = directory / METRICS
    if not path.exists():
        return pending
    keep, moved, steps = _split_records(path.read_bytes(), step)
    if not moved:
        return pending
    named = {e.get("moved_to") for e in events if e.get("event") == "rolled_back"}
    k = 1
    while (directory / f"metrics.rolled_back.{k}.jsonl").exists() or \
            f"metrics.rolled_back.{k}.jsonl" in named:
        k += 1
    event = {"event": "rolled_back", "at": now_iso(), "step": step, "records": len(moved),
             "first_step": min(steps), "last_step": max(steps),
             "moved_to": f"metrics.rolled_back.{k}.jsonl"}
    recorded = [*unrecorded, event]

    def record(data: dict[str, Any]) -> None:
        data.setdefault("events", []).extend(recorded)

    update_run_json(directory, record)  # first: from here on the side file is named
    unrecorded.clear()
    _move_records(directory, event["moved_to"], keep, moved)
    return event


def _interrupted_roll_back(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The `rolled_back` event a kill interrupted: the newest one, when no `resumed` event
    follows it (a roll-back is always followed by its resume before training goes on)."""
    for event in reversed(events):
        if event.get("event") == "resumed":
            return None
        if event.get("event") == "rolled_back" and isinstance(event.get("step"), int) \
                and isinstance(event.get("moved_to"), str):
            return event
    return None


def _finish_roll_back(directory: Path, event: dict[str, Any]) -> None:
    """Complete the move an interrupted roll-back recorded: idempotent. metrics.jsonl is
    replaced only after the side file is complete, so while it still holds records beyond
    the event's step, those are exactly the ones to move; once it holds none, the move is
    done (and the side file complete)."""
    path = directory / METRICS
    if not path.exists():
        return
    keep, moved, _ = _split_records(path.read_bytes(), event["step"])
    if moved:
        _move_records(directory, event["moved_to"], keep, moved)


def _split_records(data: bytes, step: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """metrics.jsonl's lines kept (up to `step`), those beyond it, and their steps."""
    keep, moved, steps = [], [], []
    for line in data.splitlines(keepends=True):
        try:
            record_step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            record_step = None  # unreadable lines stay where they are (readers skip them)
        if isinstance(record_step, int) and record_step > step:
            moved.append(line)
            steps.append(record_step)
        else:
            keep.append(line)
    return keep, moved, steps


def _move_records(directory: Path, side_name: str, keep: list[bytes], moved: list[bytes]
                  ) -> None:
    """Write `moved` to the side file (complete and durable, replacing any earlier attempt's),
    then replace metrics.jsonl by `keep` in one rename."""
    _replace_durably(directory / side_name, b"".join(moved))
    _replace_durably(directory / METRICS, b"".join(keep))


def _replace_durably(path: Path, data: bytes) -> None:
    """`path` holds `data`, complete and durable, or what it held before (a kill leaves at
    most a temporary file, which the next in-place start removes)."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(path.parent)
