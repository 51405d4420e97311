"""`trainer.async_save` (R-CKPT-8): background saves hold exactly what synchronous ones hold.

Both runs go through tests/recovery/hold_writes.py, which holds every background write until
training has run two more updates: the state in the live tensors (all on the CPU here) has
moved on by then, so a writer that saved references instead of copies (or copied only the
tensors on a GPU) would write a later state than the boundary's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support import TESTS, assert_ok, run_torchrun, worker_env, write_recipe
from tests.support.state_compare import assert_training_state_equal, comparable_records

RECIPE = {"trainer.max_updates": 100, "trainer.save_every": 20, "trainer.validate_every": 25,
          "trainer.log_every": 5, "trainer.save_best": True}
GUARD = 300


def hold_env(log: Path, hold: dict) -> dict[str, str]:
    return worker_env(PYTHONPATH=str(TESTS / "recovery"), EMBODICHAIN_TEST_HOLD=json.dumps(hold),
                      EMBODICHAIN_TEST_HOLD_LOG=str(log))


def events(log: Path, rank: int = 0) -> list[dict]:
    path = Path(f"{log}.rank{rank}")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_background_saves_equal_synchronous_ones(tmp_path: Path) -> None:
    """Catches a background save that aliases the live state (a later state than the
    boundary's), one that drops a rank's entry or a callback's save (best.pt), and one that
    reorders or skips a file."""
    runs = {}
    for mode in (True, False):
        name = "async" if mode else "sync"
        recipe = write_recipe(tmp_path / f"{name}.yaml", tmp_path / name,
                              **RECIPE, **{"trainer.async_save": mode})
        log = tmp_path / f"{name}.log"
        assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                               module="hold_writes", env=hold_env(log, {"behind": 2}),
                               timeout=GUARD))
        runs[name] = tmp_path / name
        if mode:
            writes = events(log)
            # the writes really ran behind training: step files 20..80 while training was
            # two updates further on (step 100 and the last best.pt are waited for at the end)
            behind = [w["step"] for w in writes if w["updates_behind"] >= 2]
            assert {20, 40, 60, 80} <= set(behind), writes
            assert all(w["thread"].startswith("embodichain-save-") for w in writes), writes
        else:
            assert events(log) == []  # no background write at all

    names = sorted(p.name for p in runs["async"].glob("*.pt"))
    assert names == sorted(p.name for p in runs["sync"].glob("*.pt"))
    assert names == ["best.pt", "last.pt", "step_100.pt", "step_20.pt", "step_40.pt",
                     "step_60.pt", "step_80.pt"]
    for name in names:
        assert assert_training_state_equal(runs["async"] / name, runs["sync"] / name) >= 18
    assert read_checkpoint(runs["async"] / "last.pt")["manifest"]["step"] == 100
    assert comparable_records(runs["async"]) == comparable_records(runs["sync"])
    assert not [p for p in runs["async"].iterdir() if p.name.endswith(".tmp")]
