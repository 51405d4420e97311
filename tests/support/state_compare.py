"""Strict comparison of saved training state, shared by every exact-resume test.

Exact recovery (R-RESUME-1, R-CKPT-5) means more than equal tensors: Python's RNG state,
NumPy's `pos`/`has_gauss`/cached value, each sampler's `batches_drawn`, the optimizer's and
scheduler's param groups and counters, and callback state are plain values; a resume that
lost any of them would still have equal tensors for a while. So everything is compared:
tensors bitwise (`torch.equal`, same dtype and shape), all other values by type and value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.measured import is_measured
from embodichain.core.runs.run_dir import read_metrics


def assert_state_equal(a: Any, b: Any, where: str = "") -> int:
    """Structural equality; tensors bitwise (`torch.equal`, same dtype and shape).

    Returns the number of tensors compared, so that callers can check it is not vacuous.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} " \
                                                          f"vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: tensors differ"
        return 1
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping), where
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        return sum(assert_state_equal(a[k], b[k], f"{where}.{k}") for k in a)
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        return sum(assert_state_equal(x, y, f"{where}[{i}]") for i, (x, y) in
                   enumerate(zip(a, b, strict=True)))
    if isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
        return 0
    assert a == b and type(a) is type(b), f"{where}: {a!r} vs {b!r}"
    return 0


def assert_payloads_equal(a: Mapping[str, Any], b: Mapping[str, Any], *,
                          callbacks: bool = True) -> int:
    """Two checkpoint payloads hold the same training state; returns the tensors compared.

    Compared: the step and the metrics carried with it, the learner (model, optimizer and
    scheduler state with their param groups, grad scaler), every rank's RNG streams (torch,
    CUDA, Python, NumPy), sampler (generator and `batches_drawn`) and buffers, and, unless
    `callbacks=False` (runs whose recipes add different callbacks), callback state. The run
    identity (run id, times, output directory) is what may differ.
    """
    ra, rb = a["run"], b["run"]
    assert ra["step"] == rb["step"], f"step {ra['step']} vs {rb['step']}"
    assert_state_equal(ra.get("metrics"), rb.get("metrics"), "run.metrics")
    count = assert_state_equal(a["learner"], b["learner"], "learner")
    assert sorted(a["ranks"]) == sorted(b["ranks"]) != [], "ranks"
    for rank in a["ranks"]:
        mine, theirs = a["ranks"][rank], b["ranks"][rank]
        # the parts most easily lost on resume, named so a failure says which
        assert_state_equal(mine["sampler"].get("batches_drawn"),
                           theirs["sampler"].get("batches_drawn"),
                           f"ranks.{rank}.sampler.batches_drawn")
        assert_state_equal(mine["rng"]["python"], theirs["rng"]["python"],
                           f"ranks.{rank}.rng.python")
        count += assert_state_equal(mine, theirs, f"ranks.{rank}")
    if callbacks:
        count += assert_state_equal(a.get("callbacks"), b.get("callbacks"), "callbacks")
    return count


def assert_training_state_equal(a: Path, b: Path, *, callbacks: bool = True) -> int:
    """`assert_payloads_equal` for two checkpoint files (each read and digest-verified)."""
    return assert_payloads_equal(read_checkpoint(a)["payload"], read_checkpoint(b)["payload"],
                                 callbacks=callbacks)


def comparable_records(directory: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run without `time/` keys (R-RESUME-1 compares the rest); it must
    read cleanly: no torn or bad line."""
    log = read_metrics(directory / "metrics.jsonl")
    assert log.torn is None and not log.bad_lines
    return [{k: v for k, v in r.items() if not is_measured(k)} for r in log.records]


# -- the whole outcome of a recovered run ------------------------------------------------------


def event_summary(directory: Path) -> list[tuple[Any, ...]]:
    """run.json's events, each as `("resumed", step)`, `("rolled_back", step, records)` or
    `(name,)` for any other event: what a scenario implies, without times. A `failed`
    event is left out: after a kill of another rank, whether rank 0 records the failure it
    saw or is ended by the launcher first is a race (cli/test_cli_runs.py tests the event)."""
    import json

    summary: list[tuple[Any, ...]] = []
    for event in json.loads((directory / "run.json").read_text()).get("events") or []:
        if event["event"] == "failed":
            continue
        if event["event"] == "resumed":
            summary.append(("resumed", event["step"]))
        elif event["event"] == "rolled_back":
            summary.append(("rolled_back", event["step"], event["records"]))
        else:
            summary.append((event["event"],))
    return summary


def _without_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_measured(k)} for r in records]


def assert_rolled_back_records(run: Path, reference: Path) -> None:
    """Each `rolled_back` event of run.json names a side file holding exactly its `records`
    records, all beyond its step, the same (without `time/`) as the reference's from there
    (the killed run was exact too), and immediately followed by the `resumed` event at its
    step; every side file is named by one event (R-RESUME-6: a roll-back records its event
    before it moves anything, so not even a kill leaves one that none names)."""
    import json

    events = json.loads((run / "run.json").read_text()).get("events") or []
    expected = comparable_records(reference)
    named = []
    for i, event in enumerate(events):
        if event["event"] != "rolled_back":
            continue
        step = event["step"]
        following = [e for e in events[i + 1:] if e["event"] != "damaged_snapshots_set_aside"]
        assert following and (following[0]["event"], following[0]["step"]) == ("resumed", step), \
            f"{event} is not followed by its resume: {events}"
        side = run / event["moved_to"]
        named.append(side.name)
        moved = _without_time([json.loads(line) for line in side.read_text().splitlines()])
        assert len(moved) == event["records"] > 0, (event, len(moved))
        steps = [r["step"] for r in moved]
        assert (min(steps), max(steps)) == (event["first_step"], event["last_step"]), event
        beyond = [r for r in expected if r["step"] > step]
        assert moved == beyond[:len(moved)], f"{side.name}: not the reference's history"
    sides = sorted(p.name for p in run.glob("metrics.rolled_back.*.jsonl"))
    assert len(set(named)) == len(named) and set(named) == set(sides), (named, sides)


def assert_same_outcome(run: Path, reference: Path, *, events: list[tuple[Any, ...]] | None,
                        records_after: int = 0, callbacks: bool = True,
                        checkpoints: list[str] | None = None,
                        foreign: tuple[str, ...] = ()) -> int:
    """A recovered run's whole outcome equals the uninterrupted reference's (R-RESUME-1):

    - every checkpoint of the run (`*.pt`: last.pt and each step file; or the names in
      `checkpoints`, where the runs save at other intervals) exists in the reference and
      holds the same state (`assert_training_state_equal`: every tensor, the
      per-rank state, the metrics carried along and, unless `callbacks=False`, callbacks);
    - metrics.jsonl without `time/` keys equals the reference's records beyond
      `records_after` (0: the whole history, as for a run continued in place; the resume's
      step for a run resumed into a fresh directory);
    - run.json's events, as `event_summary` gives them, equal `events` (what the scenario
      implies: a `("rolled_back", step, records)` wherever records were past the snapshot,
      then `("resumed", step)`); None where random kills make them unpredictable (the
      caller checks them); in every case `assert_rolled_back_records`;
    - no temporary file is left (but the `foreign` ones a test put there itself).

    Returns the number of tensors compared.
    """
    names = sorted(p.name for p in run.glob("*.pt")) if checkpoints is None else checkpoints
    assert "last.pt" in names, f"{run}: no last.pt"
    count = 0
    for name in names:
        assert (reference / name).is_file(), f"{run / name}: the reference has no {name}"
        compared = assert_training_state_equal(reference / name, run / name, callbacks=callbacks)
        assert compared > 0, name
        count += compared
    expected = [r for r in comparable_records(reference) if r["step"] > records_after]
    assert expected, "the reference has no records to compare"
    records = comparable_records(run)
    assert records == expected, _first_difference(records, expected)
    if events is not None:
        summary = event_summary(run)
        assert summary == events, f"run.json events {summary}, expected {events}"
    assert_rolled_back_records(run, reference)
    leftovers = sorted(p.name for p in run.iterdir()
                       if p.name.endswith(".tmp") and p.name not in foreign)
    assert not leftovers, leftovers
    return count


def _first_difference(records: list[dict[str, Any]], expected: list[dict[str, Any]]) -> str:
    steps = [r.get("step") for r in records]
    for i, (a, b) in enumerate(zip(records, expected, strict=False)):
        if a != b:
            return f"record {i} differs: {a} vs the reference's {b}; steps {steps}"
    return f"{len(records)} records vs the reference's {len(expected)}; steps {steps}"


def implied_events(directory: Path, snapshot_step: int) -> list[tuple[Any, ...]]:
    """The events run.json must hold once `directory` is continued in place from its
    snapshot at `snapshot_step`: those it holds now, then a roll-back of every record now
    beyond that step (if any), then the resume (for `assert_same_outcome`)."""
    beyond = [r for r in read_metrics(directory / "metrics.jsonl").records
              if r["step"] > snapshot_step]
    rolled = [("rolled_back", snapshot_step, len(beyond))] if beyond else []
    return [*event_summary(directory), *rolled, ("resumed", snapshot_step)]
