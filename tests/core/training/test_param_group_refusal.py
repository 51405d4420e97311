"""A factory parameter group with `lr_scale` 0 or negative is bad input, refused before
anything starts (exit 2, naming the group), by train-sl, under torchrun, and by
`validate-config --build`; plain `validate-config` says that it did not build the trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import factories_env, run_cli, run_torchrun, write_recipe

MESSAGE = "the factory's param_groups[0] ('first'): lr_scale must be a finite number > 0"


def _recipe(tmp_path: Path, scale: float) -> tuple[Path, Path]:
    run = tmp_path / "run"
    return write_recipe(tmp_path / "r.yaml", run, **{
        "factory": "scaled:build_supervised_trainer", "trainer.max_updates": 2,
        "groups.first_lr_scale": scale}), run


def test_bad_lr_scale_is_refused_as_bad_input(tmp_path: Path, scale: float = 0.0) -> None:
    """Catches train-sl exiting 1 with "run with --debug" (a training failure: a ValueError
    from the optimizer set-up) and validate-config --build calling the recipe valid."""
    recipe, run = _recipe(tmp_path, scale)
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=factories_env())
    assert proc.returncode == 2, proc.stderr
    assert f"{MESSAGE}" in proc.stderr and f"got {scale}" in proc.stderr
    assert "--debug" not in proc.stderr and not run.exists()
    built = run_cli("validate-config", str(recipe), "--build", env=factories_env())
    assert built.returncode == 2, built.stderr
    assert MESSAGE in built.stderr and not run.exists()
    plain = run_cli("validate-config", str(recipe), env=factories_env())
    assert plain.returncode == 0 and "--build checks it too" in plain.stderr


@pytest.mark.slow  # launches torchrun workers
def test_bad_lr_scale_under_torchrun_exits_2_on_every_worker(tmp_path: Path) -> None:
    """Catches the refusal reaching torchrun as a failure (exit 1 per worker) or printed by
    every rank."""
    recipe, run = _recipe(tmp_path, -0.5)
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=factories_env())
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output  # torchrun's own code, with its failure report
    # the first worker to exit is reported (torchrun then stops the other): with 2, not 1
    assert "exitcode  : 2" in output and "exitcode  : 1" not in output, output
    assert output.count(f"error: {MESSAGE}") == 1, output
    assert not run.exists()
