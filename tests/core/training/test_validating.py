"""What a validation that ran to its end leaves in the snapshots saved during it (R-EVAL-4)."""

from __future__ import annotations

from pathlib import Path

from embodichain.core.checkpoint.file import read_checkpoint
from tests.support.in_process import train_in_process


def test_a_save_made_during_a_finished_validation_is_not_marked_due(tmp_path: Path) -> None:
    """Catches the flag never cleared when a validation runs to its end: best.pt, which
    `trainer.save_best` writes as the validation of update 2 ends, would say that
    validation is still due (`validation_due`), and a run resumed from it would validate
    update 2 again (another best-metric record, another best.pt)."""
    run = tmp_path / "run"
    train_in_process(run, ["trainer.max_updates=2", "trainer.validate_every=2",
                           "trainer.save_every=0", "trainer.log_every=1",
                           "trainer.save_best=true"])
    best = read_checkpoint(run / "best.pt")["payload"]["run"]
    assert best["step"] == 2
    assert "validation_due" not in best
