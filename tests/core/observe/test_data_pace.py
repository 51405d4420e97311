"""The data's pace (core/observe/pace.py): examples/s and the share of time waiting for data,
rank 0's and the slowest rank's, in metrics.jsonl, the progress line and the report."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest
from rich.console import Console

from embodichain.core.observe.pace import DataPace
from embodichain.core.observe.progress import ProgressLine, ProgressReporter
from tests.support import assert_ok, factories_env, run_torchrun, write_recipe
from tests.support.state_compare import comparable_records


@pytest.mark.slow
def test_the_slowest_ranks_wait_reaches_rank_zero(tmp_path: Path) -> None:
    """Rank 1's examples take 3 ms each, rank 0's none: rank 0 records its own small wait
    and rank 1's large one as the slowest. Catches: the waits not carried by the update's
    all-reduce (rank 0 would only know its own), a slot mixed up between ranks, or the
    figures missing from metrics.jsonl."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="augmenting:build_supervised_trainer",
                          **{"trainer.max_updates": 20, "trainer.log_every": 10,
                             "trainer.validate_every": 0, "trainer.save_every": 0,
                             "trainer.batch_size": 8})
    env = factories_env(EMBODICHAIN_TEST_SLOW_RANK="1:0.003")
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()
               if "time/data_wait" in line]
    assert [r["step"] for r in records] == [10, 20]
    for r in records:
        assert 0.0 <= r["time/data_wait"] <= r["time/data_wait_max"] <= 1.0
        # rank 1 sleeps 24 ms per update for its batch; rank 0 only indexes memory
        assert r["time/data_wait_max"] > 2 * r["time/data_wait"], r
        assert r["time/examples_per_s"] > 0
    # time/ figures are left out of the comparable records (they are not deterministic)
    assert all(not k.startswith("time/") for r in comparable_records(tmp_path / "run")
               for k in r)


PROBED = {"factory": "probing:build_supervised_trainer", "trainer.max_updates": 10,
          "trainer.log_every": 5, "trainer.validate_every": 5, "trainer.save_every": 0,
          # G = 32 on 2 ranks with micro-batches of 8: K = 2, loaded one at a time inside
          # the update (R-ELASTIC-1), 16 examples per rank per update.
          "trainer.global_batch_size": 32, "trainer.batch_size": 8}
SLEEP_S = 0.002  # per example on rank 0; rank 1 sleeps three times as long
EXAMPLES_PER_RANK = 16


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two workers of tests/factories/probing.py under G: rank 1's examples load three times
    as slowly as rank 0's; each rank records the data wait it measured, the waits the
    update's all-reduce brought back, and where evaluate and the validation callback ran."""
    root = tmp_path_factory.mktemp("probed")
    records = root / "records"
    records.mkdir()
    recipe = write_recipe(root / "r.yaml", root / "run", **PROBED)
    env = factories_env(RECORD_DIR=str(records), PROBE_SLEEP_S=str(SLEEP_S))
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env))
    return root


def _waits(root: Path) -> dict[int, dict[int, dict]]:
    """{rank: {update: record}} of the probing factory's wait records."""
    out: dict[int, dict[int, dict]] = {}
    for path in sorted((root / "records").glob("waits.rank*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out.setdefault(r["rank"], {})[r["step"]] = r
    return out


@pytest.mark.slow
def test_under_g_the_data_wait_counts_the_micro_batches_loaded_inside_the_update(
        probed_run: Path) -> None:
    """Under G each micro-batch is loaded when the learner reaches it, inside the update:
    every rank's measured wait of every update is at least what its examples slept (16 x
    2 ms on rank 0, 16 x 6 ms on rank 1), and the all-reduce brings each rank's own wait
    back in its own slot, unchanged (float32); `time/data_wait` times the window between
    two log lines is at least half rank 0's sleep. Catches the wait taken before the update
    (where nothing is loaded under G: about 0, so `time/data_wait` says the data never
    holds training back) and waits averaged or mixed up between ranks."""
    waits = _waits(probed_run)
    assert sorted(waits) == [0, 1] and all(sorted(w) == list(range(1, 11))
                                          for w in waits.values())
    for rank, updates in waits.items():
        slept = EXAMPLES_PER_RANK * SLEEP_S * (1 + 2 * rank)
        for step, record in updates.items():
            assert record["own"] >= slept, (rank, step, record["own"], slept)
    for step in range(1, 11):
        carried = [_float32(waits[r][step]["own"]) for r in (0, 1)]
        assert waits[0][step]["waits"] == waits[1][step]["waits"] == carried, step
    # The recorded share itself: rank 0's waits over updates 6..10 (at least 5 x 32 ms of
    # sleep) over the window between the two log lines, which `time/elapsed_s` brackets to
    # within a few statements (half the sleep is a bound no scheduling delay comes near).
    first, second = [json.loads(line) for line in (probed_run / "run/metrics.jsonl").open()
                     if "time/data_wait" in line]
    window = second["time/elapsed_s"] - first["time/elapsed_s"]
    assert second["time/data_wait"] * window >= 0.5 * 5 * EXAMPLES_PER_RANK * SLEEP_S, \
        (second, window)


@pytest.mark.slow
def test_data_wait_max_is_the_slowest_ranks_wait_exactly(probed_run: Path) -> None:
    """In a log window, `time/data_wait_max` / `time/data_wait` (both shares of the same
    wall time) equals sum over updates of the slowest rank's wait / sum of rank 0's, from
    the waits the ranks themselves measured: exact up to float64 rounding, whatever the wall
    time. Catches the slowest rank's wait averaged over the ranks (with 8 ranks one slow
    reader would show an eighth of its wait; here 2/3 of it), summed, or taken from the last
    update of the window only."""
    waits = _waits(probed_run)
    records = [json.loads(line) for line in (probed_run / "run" / "metrics.jsonl").open()
               if "time/data_wait" in line]
    assert [r["step"] for r in records] == [5, 10]
    # The window of updates 6..10: it opens as rank 0 logs update 5, before the validation
    # that every rank waits for, so rank 1's waits all lie inside it and no share is capped
    # at 1 (the first window opens when rank 0 enters fit(), which rank 1 may precede).
    record = records[1]
    window = range(6, 11)
    own = sum(_float32(waits[0][u]["own"]) for u in window)
    slowest = sum(max(_float32(waits[r][u]["own"]) for r in (0, 1)) for u in window)
    assert 0.0 < record["time/data_wait"] < record["time/data_wait_max"] < 1.0, record
    assert record["time/data_wait_max"] / record["time/data_wait"] == \
        pytest.approx(slowest / own, rel=1e-12), (record, slowest, own)
    assert records[0]["time/data_wait"] < records[0]["time/data_wait_max"]


@pytest.mark.slow
def test_validation_and_its_callbacks_run_on_rank_zero_only(probed_run: Path) -> None:
    """R-VAL-1 under DDP: at updates 5 and 10, `evaluate` and the factory's validation
    callback ran once each, on rank 0. Catches validation run by every rank (a callback that
    writes files or uploads would then act once per rank) and callbacks skipped."""
    calls = sorted(p.name for p in (probed_run / "records").iterdir()
                   if p.name.startswith(("evaluate.", "callback.")))
    assert calls == ["callback.rank0.step10", "callback.rank0.step5",
                     "evaluate.rank0.step10", "evaluate.rank0.step5"], calls


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def test_pace_is_exact_for_known_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a clock the test sets: 2 s between two log lines, rank 0 waiting 0.1 + 0.2 s and
    rank 1 0.5 + 0.1 s, `time/data_wait` is 0.15 (rank 0's share) and `time/data_wait_max`
    0.35 (the slowest rank of each update: 0.5 + 0.2, over 2 s); 64 examples per update
    give 64 examples/s. Catches the slowest wait averaged over ranks (0.225), the largest
    rank total taken instead of each update's slowest (0.3), and rank 0's slot misread."""
    from embodichain.core.observe import pace as pace_module

    now = [100.0]
    monkeypatch.setattr(pace_module.time, "perf_counter", lambda: now[0])
    pace = DataPace(examples_per_update=64)
    pace.add([0.1, 0.5], rank=0)
    pace.add([0.2, 0.1], rank=0)
    now[0] += 2.0
    assert pace.metrics() == pytest.approx({"time/examples_per_s": 64.0,
                                            "time/data_wait": 0.15,
                                            "time/data_wait_max": 0.35}, rel=1e-12)
    pace.add([0.3, 0.1], rank=1)  # rank 1's own share from its own slot
    now[0] += 1.0
    assert pace.metrics()["time/data_wait"] == pytest.approx(0.1, rel=1e-12)


def test_pace_sums_between_log_lines() -> None:
    """One rank's share and the slowest's, reset after each read. Catches the share taken
    from the last update only, or sums that are never reset."""
    pace = DataPace(examples_per_update=64)
    pace.add([0.0, 0.5], rank=0)
    pace.add([0.25, 0.0], rank=0)
    first = pace.metrics()
    assert first["time/data_wait"] <= first["time/data_wait_max"]
    assert first["time/examples_per_s"] > 0
    empty = pace.metrics()
    assert empty["time/data_wait"] == 0.0 and empty["time/examples_per_s"] == 0.0


def test_the_progress_line_shows_the_pace() -> None:
    reporter = ProgressReporter(100, 0, enabled=False, every=10)
    reporter.update(10, loss=0.5, examples_per_s=3940.0, data_wait=0.12)
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(ProgressLine(reporter))
    text = console.export_text()
    assert "3940 ex/s data  12%" in text, text
