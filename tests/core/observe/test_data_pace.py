"""The data's pace (core/observe/pace.py): examples/s and the share of time waiting for data,
rank 0's and the slowest rank's, in metrics.jsonl, the progress line and the report."""

from __future__ import annotations

import io
import json
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
