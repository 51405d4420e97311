"""Data refused at start-up exits 2 whatever the factory does with the reader's error (design
§9, R-SCALE-2), so a restart never retries it (R-PROC-3); a bad `shard_blocks` too.

The factories are tests/factories/refusing_data.py: `sl_ddp` opening a LeRobot dataset that
does not exist, the reader's error let through (`direct`) or wrapped in the factory's own
RuntimeError (`wrapped`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import factories_env, run_cli, run_torchrun, write_recipe

MISSING_INFO = "meta/info.json is missing"


def _recipe(tmp_path: Path, factory: str, **changes: object) -> Path:
    return write_recipe(tmp_path / f"{factory}.yaml", tmp_path / "run",
                        **{"factory": f"refusing_data:{factory}", **changes})


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return factories_env(EMBODICHAIN_TEST_DATASET=str(tmp_path / "no-such-dataset"),
                         EMBODICHAIN_TEST_ATTEMPTS=str(tmp_path / "attempts"), **extra)


def test_a_dataset_error_exits_2_let_through_or_wrapped_by_the_factory(tmp_path: Path) -> None:
    """Catches the reader's format error not being a DataFormatError (the docs' factory lets
    it through: exit 1) and a CLI that does not follow a foreign exception's cause chain to
    the refusal behind it (the wrapping factory: exit 1, `RuntimeError: ...`): re-raised
    `from exc` (`__cause__`), implicitly in the `except` block (`__context__`) or `from None`
    (`__context__` kept, only hidden from the traceback: the refusal is still what stopped
    the factory). A chain followed through `__cause__` only, or one that honours
    `__suppress_context__`, exits 1 for the last two."""
    for factory in ("direct", "wrapped", "implicit", "suppressed"):
        proc = run_cli("train-sl", "--config", str(_recipe(tmp_path, factory)), "--no-progress",
                       env=_env(tmp_path))
        assert proc.returncode == 2, (factory, proc.stderr)
        assert MISSING_INFO in proc.stderr and "RuntimeError" not in proc.stderr, proc.stderr
        assert not (tmp_path / "run").exists()
    assert "error: could not open the training data: " in proc.stderr  # the wrapper's words


def test_a_bad_shard_blocks_exits_2_naming_it(tmp_path: Path) -> None:
    """Catches `shard_blocks` checked with a bare ValueError (exit 1 and a traceback-style
    `ValueError: ...`, retried by a restart)."""
    recipe = _recipe(tmp_path, "bad_blocks", **{"trainer.strategy": "fsdp"})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=_env(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "error: shard_blocks[1] is not a sub-module of the model" in proc.stderr


@pytest.mark.slow
def test_a_refused_dataset_under_self_launch_is_not_retried(tmp_path: Path) -> None:
    """Catches a wrapped dataset error taken for a failure (exit 1 on each worker): the
    self-launcher restarts it (`--max-restarts 1`: a second attempt of each rank, exit 1).
    Wrapped `from None` (the refusal only in `__context__`): the hardest chain, and the
    launcher's path is the same whatever the chain (each worker's verdict is the one the
    in-process test above checks for all four factories), so one launch covers both the
    `from exc` and the `from None` variants (a walk of `__cause__` only fails here)."""
    proc = run_cli("train-sl", "--config", str(_recipe(tmp_path, "suppressed")), "--no-progress",
                   "--nproc-per-node", "2", "--max-restarts", "1", env=_env(tmp_path))
    attempts = sorted((tmp_path / "attempts").read_text().splitlines())
    assert attempts == ["0 0", "1 0"], (attempts, proc.stderr)
    assert proc.returncode == 2, proc.stderr
    assert "restarting" not in proc.stderr
    assert proc.stderr.count(f"{MISSING_INFO}") >= 1


@pytest.mark.slow
def test_under_torchrun_every_worker_reports_exit_2(tmp_path: Path) -> None:
    """Catches a refusing rank that torchrun's SIGTERM kills while it shuts down (reported as
    exitcode -15, not 2): rank 1 lingers at exit after rank 0 has gone. torchrun itself
    exits 1, its report showing each worker's own code."""
    proc = run_torchrun("train-sl", "--config", str(_recipe(tmp_path, "wrapped")),
                        "--no-progress", env=_env(tmp_path, EMBODICHAIN_TEST_SLOW_EXIT_RANK="1"))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    codes = re.findall(r"exitcode\s+: (-?\d+)", output)  # the report, not the log line
    assert sorted(codes) == ["2", "2"], output
    assert output.count("could not open the training data: ") >= 2  # both workers' reports
