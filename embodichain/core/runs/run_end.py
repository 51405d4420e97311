"""How a run ended, as run.json records it (R-RUN-2): a clean stop, a failure, or no word.

From run.json format 2 on (`format_version`, written by a fresh claim and by every resume),
a clean stop (SIGINT / SIGTERM, its snapshot saved) is recorded as a `stopped` event, by
rank 0, once that snapshot is durable; a failure that rank 0 lives to see (exit 1: a data
failure, a non-finite loss, a peer gone) as a `failed` event with its message. A run that is
neither live, finished nor stopped early and whose last word since its newest start is
neither was interrupted (killed, its machine gone). A run.json of format 1 (before this
record) cannot tell the two apart: its end is unknown. Torch-free: `runs` reads it.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodichain.core.errors import peer_lost
from embodichain.core.runs.run_dir import now_iso, update_run_json

RUN_JSON_FORMAT = 2  # 2: clean stops are recorded; absent (1): they were not
STOPPED = "stopped"
FAILED = "failed"


def record_clean_stop(directory: Path, step: int, signum: int, rank_zero: bool) -> None:
    """Append the `stopped` event to run.json (rank 0 only; call after the stop's snapshot
    is durable, so the event never names an update without its snapshot)."""
    if not rank_zero:
        return
    event = {"event": STOPPED, "at": now_iso(), "step": step,
             "signal": signal.Signals(signum).name}
    update_run_json(directory, lambda data: data.setdefault("events", []).append(event))


def record_failure(directory: Path, step: int, error: BaseException) -> None:
    """Append the `failed` event to run.json (rank 0 only): the update it failed at, and the
    first line of the error."""
    lines = str(error).strip().splitlines()
    said = peer_lost(error) or f"{type(error).__name__}: {lines[0] if lines else ''}"
    event = {"event": FAILED, "at": now_iso(), "step": step, "error": said[:500]}
    update_run_json(directory, lambda data: data.setdefault("events", []).append(event))


def failure(run_json: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `failed` event when it is the run's last word (no resume after it), else None."""
    return _last_word(run_json, FAILED)


def records_clean_stops(run_json: Mapping[str, Any]) -> bool:
    """Whether this run.json records clean stops (format 2 or later)."""
    version = run_json.get("format_version")
    return isinstance(version, int) and not isinstance(version, bool) \
        and version >= RUN_JSON_FORMAT


def clean_stop(run_json: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `stopped` event when it is the run's last word (no resume after it), else None."""
    return _last_word(run_json, STOPPED)


def _last_word(run_json: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for event in reversed(run_json.get("events") or []):
        if not isinstance(event, dict):
            continue
        if event.get("event") in (STOPPED, FAILED):
            return event if event.get("event") == kind else None
        if event.get("event") == "resumed":
            return None
    return None
