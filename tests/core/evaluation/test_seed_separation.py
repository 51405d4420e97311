"""Selection apart from report (R-TRUST-2): the validation seeds pick best.pt, `eval`
reports on test seeds no validation touched, and overlapping ranges are refused at start.

The recipe is tests/core/evaluation/test_closed_loop.py's (`Reach`, a fixed linear policy):
7 validation episodes from seed 100, 2 updates.
"""

from __future__ import annotations

import json
from pathlib import Path

from embodichain.core.evaluation.intervals import successes_of, wilson_interval
from tests.core.evaluation.test_closed_loop import EPISODES, records, write
from tests.support import assert_ok, factories_env, run_cli

TEST_SEED = 200_000


def _said(proc) -> str:
    return " ".join(proc.stderr.split())


def test_overlapping_validation_and_test_seeds_are_refused_at_start(tmp_path: Path) -> None:
    """`evaluation.test_seed` 103 over validation seeds 100..106: train-sl exits 2 with one
    message naming both ranges, and no run directory is claimed. Catches a recipe whose
    reported figure comes from seeds that chose its checkpoint."""
    recipe = write(tmp_path / "r.yaml", tmp_path / "run",
                   evaluation={"test_seed": 103, "videos": 0})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=factories_env())
    said = _said(proc)
    assert proc.returncode == 2, proc.stderr
    assert "test seeds 103..109 overlap the validation seeds 100..106" in said, said
    assert "Traceback" not in said and said.count("the validation seeds") == 1, said
    assert not (tmp_path / "run" / "run.json").exists()


def test_eval_reports_on_the_test_seeds_and_refuses_the_validation_ones(tmp_path: Path
                                                                        ) -> None:
    """A run whose recipe declares `test_seed: 200000`: `eval` without --seed judges
    200000..200006 (summary.json says `seed_role: test`, each success rate with its Wilson
    interval, printed beside it); `--seed 103` (overlapping the validation seeds 100..106)
    is refused, exit 2, naming both ranges, nothing written. Catches eval judging the
    validation seeds by default (the selection seeds reported), and a --seed that quietly
    re-judges them."""
    recipe = write(tmp_path / "r.yaml", tmp_path / "run",
                   evaluation={"test_seed": TEST_SEED, "videos": 0},
                   trainer={"max_updates": 2, "save_every": 2})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env()))
    validated = records(tmp_path / "run" / "evaluations" / "update_000002.jsonl")
    assert [r["seed"] for r in validated] == list(range(100, 100 + EPISODES))

    proc = run_cli("eval", str(tmp_path / "run"), "--out", str(tmp_path / "test"),
                   "--no-progress", env=factories_env())
    assert_ok(proc)
    got = records(tmp_path / "test" / "episodes.jsonl")
    assert [r["seed"] for r in got] == list(range(TEST_SEED, TEST_SEED + EPISODES))
    summary = json.loads((tmp_path / "test" / "summary.json").read_text())
    assert summary["seed_role"] == "test" and summary["seeds"] == "200000..200006"
    rate = summary["metrics"]["validation/success_rate"]
    low, high = wilson_interval(successes_of(rate, EPISODES), EPISODES)
    assert summary["intervals"]["validation/success_rate"] == [round(low, 4), round(high, 4)]
    assert f"{low:.3f}-{high:.3f}" in proc.stdout and "test seeds" in proc.stdout

    proc = run_cli("eval", str(tmp_path / "run"), "--seed", "103", "--out",
                   str(tmp_path / "again"), "--no-progress", env=factories_env())
    said = _said(proc)
    assert proc.returncode == 2, proc.stderr
    assert "seeds 103..109, which overlap the validation seeds 100..106" in said, said
    assert not (tmp_path / "again").exists()
