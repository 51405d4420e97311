"""Roll-back (R-RESUME-6): records beyond the snapshot move to a side file that run.json names.

`runs.roll_back.roll_back` records its `rolled_back` event before any record moves, so that a
kill at any point leaves no side file that no event names; a roll-back a kill interrupted
(its event not followed by a `resumed` one) is finished by the next call, once. The real
kills are in tests/recovery/test_recovery_sigkill.py; these are the states they leave, built
by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodichain.core.runs import roll_back as roll_back_module
from embodichain.core.runs.roll_back import roll_back

SIDE = "metrics.rolled_back.1.jsonl"


def _lines(steps: range | list[int]) -> bytes:
    return b"".join(json.dumps({"step": s, "train/loss": 1.0 / s}).encode() + b"\n"
                    for s in steps)


def _run(tmp_path: Path, events: list[dict] | None = None, logged: int = 7) -> Path:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "events": events or []}))
    (tmp_path / "metrics.jsonl").write_bytes(_lines(range(1, logged + 1)))
    return tmp_path


def _events(run: Path) -> list[dict]:
    return json.loads((run / "run.json").read_text())["events"]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_the_event_is_recorded_before_any_record_moves(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches records moved before their `rolled_back` event is in run.json (a kill in
    between leaves a side file no event names), and the caller's pending events not
    recorded with it."""
    run = _run(tmp_path)
    seen = []

    def move(directory: Path, side: str, keep: list[bytes], moved: list[bytes]) -> None:
        seen.append([e["event"] for e in _events(run)])  # what run.json says at that moment
        raise KeyboardInterrupt  # killed before anything moved

    monkeypatch.setattr(roll_back_module, "_move_records", move)
    pending = [{"event": "damaged_snapshots_set_aside", "files": ["last.pt.damaged"]}]
    with pytest.raises(KeyboardInterrupt):
        roll_back(run, 5, pending)
    assert seen == [["damaged_snapshots_set_aside", "rolled_back"]] and pending == []
    event = _events(run)[-1]
    assert (event["step"], event["records"], event["first_step"], event["last_step"],
            event["moved_to"]) == (5, 2, 6, 7, SIDE)
    assert not (run / SIDE).exists() and _steps(run / "metrics.jsonl") == list(range(1, 8))


RECORDED = {"event": "rolled_back", "at": "t", "step": 5, "records": 2, "first_step": 6,
            "last_step": 7, "moved_to": SIDE}
INTERRUPTED = {  # what the side file and metrics.jsonl hold when a kill ends the roll-back
    "before the side file is in place": (None, range(1, 8)),
    "side file torn": ([6], range(1, 8)),
    "before metrics.jsonl is replaced": ([6, 7], range(1, 8)),
    "before the resume is recorded": ([6, 7], range(1, 6)),
}


@pytest.mark.parametrize("state", list(INTERRUPTED))
def test_an_interrupted_roll_back_is_finished_once(tmp_path: Path, state: str) -> None:
    """Catches a next roll-back that ignores the recorded one (a second event and side
    file with the same records), appends to its side file (records twice) or loses
    records; and one that is not idempotent when called again."""
    side, metrics = INTERRUPTED[state]
    run = _run(tmp_path, [{"event": "resumed", "step": 0}, RECORDED])
    if side is not None:
        (run / SIDE).write_bytes(_lines(side))
    (run / "metrics.jsonl").write_bytes(_lines(metrics))
    for _ in range(2):
        assert roll_back(run, 5) == RECORDED  # the recorded event, finished
        assert _events(run) == [{"event": "resumed", "step": 0}, RECORDED]
        assert _steps(run / SIDE) == [6, 7] and _steps(run / "metrics.jsonl") == [1, 2, 3, 4, 5]
        assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", SIDE, "run.json"]


def test_a_finished_roll_back_is_not_redone(tmp_path: Path) -> None:
    """A roll-back followed by its resume is history: the next one (records past an older
    snapshot) gets an event and side file of its own; none past the snapshot: nothing."""
    run = _run(tmp_path, [RECORDED, {"event": "resumed", "step": 5}], logged=9)
    (run / SIDE).write_bytes(_lines([6, 7]))
    assert roll_back(run, 9) is None and len(_events(run)) == 2
    event = roll_back(run, 8)
    assert event is not None and (event["step"], event["records"], event["moved_to"]) == (
        8, 1, "metrics.rolled_back.2.jsonl")
    assert _events(run)[-1] == event and _steps(run / event["moved_to"]) == [9]
    assert _steps(run / SIDE) == [6, 7] and _steps(run / "metrics.jsonl") == list(range(1, 9))
