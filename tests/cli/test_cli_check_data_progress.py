"""`check-data` shows its progress (R-UX-1) off a terminal too: plain lines with the
examples checked, examples/s and the time left, ending at the count it reports; none with
`--no-progress` (test_cli_check_data.py runs that way).

Catches: a check of a large dataset silent off a terminal (rich's bar shows nothing there),
and a progress that counts other than the examples decoded (it must end at 200/200)."""

from __future__ import annotations

from pathlib import Path

from tests.support import run_cli
from tests.support.data import data_env, data_recipe


def test_check_data_shows_the_examples_checked_off_a_terminal(tmp_path: Path) -> None:
    recipe = data_recipe(tmp_path / "r.yaml", tmp_path / "run", **{"data.train_size": 200})
    done = run_cli("check-data", str(recipe), "--workers", "0", env=data_env())
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("checking data: ")]
    assert lines and lines[-1].startswith("checking data: 200/200 examples  "), done.stderr
    assert "examples/s  left 0:00:00  elapsed " in lines[-1]
    assert "all 200 training examples load" in done.stderr
