"""`trainer.keep_last`: only the newest step files stay; last.pt always does."""

from __future__ import annotations

from pathlib import Path

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.names import step_files
from tests.support import assert_ok, run_cli, write_recipe


def test_keep_last_keeps_the_newest_step_files(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{"trainer.max_updates": 120, "trainer.save_every": 10,
                             "trainer.keep_last": 2, "trainer.validate_every": 0})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    run = tmp_path / "run"
    assert [n for n, _ in step_files(run)] == [110, 120]  # by step number, not name
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 120
