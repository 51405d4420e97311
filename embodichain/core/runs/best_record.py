"""A run's best metric and early stop as run.json records them (R-MET-1, R-MET-2).

run.json's top-level `best` is the metric the run started with; a resume may change it
(`trainer.best` is a resumable change), and its `resumed` event then carries the new one, so
the newest wins. An early stop appends a `stopped_early` event; a later `resumed` event (a
raised patience) supersedes it. Torch-free: `runs`, the summary and `report` read these.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodichain.core.recipe.best import DEFAULT_BEST, Best, BestTracker, best_from
from embodichain.core.recipe.schema import EarlyStopConfig
from embodichain.core.runs.run_dir import now_iso, update_run_json

STOPPED_EARLY = "stopped_early"


def _events(run_json: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [e for e in run_json.get("events") or [] if isinstance(e, dict)]


def run_best(run_json: Mapping[str, Any] | None) -> Best:
    """The run's best metric now: the newest resume's, else the start's, else its recipe's
    `trainer.best`, else the default (a run.json written before runs recorded it)."""
    run_json = run_json or {}
    recipe = ((run_json.get("config") or {}).get("trainer") or {})
    for source in [*(e for e in reversed(_events(run_json)) if e.get("event") == "resumed"),
                   run_json, recipe]:
        if isinstance(source.get("best"), Mapping):
            try:
                return best_from(source["best"])
            except ValueError:
                break  # a damaged entry: the default rather than a crash of the reader
    return DEFAULT_BEST


def stopped_early_event(run_json: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The `stopped_early` event when it is the run's last word (no resume after it)."""
    for event in reversed(_events(run_json or {})):
        if event.get("event") == STOPPED_EARLY:
            return event
        if event.get("event") == "resumed":
            return None
    return None


def stopped_early_text(event: Mapping[str, Any]) -> str:
    return f"stopped early at update {event.get('step')} (best at {event.get('best_step')})"


def record_stopped_early(directory: Path, step: int, tracker: BestTracker,
                         early_stop: EarlyStopConfig | None) -> str:
    """Append the `stopped_early` event to run.json (rank 0, after the snapshot); returns
    the line to print."""
    event = {"event": STOPPED_EARLY, "at": now_iso(), "step": step, "best_step": tracker.step,
             "metric": tracker.best.metric, "mode": tracker.best.mode, "best": tracker.value,
             "validations_without_improvement": tracker.since,
             "patience": early_stop.patience if early_stop else None,
             "min_delta": early_stop.min_delta if early_stop else None}
    update_run_json(directory, lambda data: data.setdefault("events", []).append(event))
    return (f"{stopped_early_text(event)}: {tracker.since} validations in a row without an "
            f"improvement of {tracker.best.metric} (trainer.early_stop.patience "
            f"{event['patience']}); saved {directory / 'last.pt'}")
