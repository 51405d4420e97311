"""`inspect-checkpoint CKPT --config R` and `train-sl --config R --resume CKPT` give the same
verdict on resuming a checkpoint into its own run directory, for every state of that
directory in the table below (both ask `resume_policy.in_place_problem`).

Catches: the inspector keeping a copy of the in-place rule that lacks one of its refusals
(it once said "may resume" for a directory whose last.pt was ahead of the checkpoint, which
train-sl refuses), and either command drifting from the expected verdict of a state.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from embodichain.cli import app

RECIPE = {
    "factory": "sl_ddp", "seed": 0, "device": "cpu",
    "trainer": {"batch_size": 8, "max_updates": 4, "validate_every": 0, "save_every": 2,
                "log_every": 1, "output_dir": "unset"},
    "optimizer": {"name": "adam", "lr": 0.001},
    "model": {"hidden": 8},
    "data": {"train_size": 256, "val_size": 64, "seed": 1234},
}


def _invoke(*args: str) -> int:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code


def _recipe(path: Path, output_dir: Path) -> Path:
    recipe = json.loads(json.dumps(RECIPE))
    recipe["trainer"]["output_dir"] = str(output_dir)
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-update run: step_2.pt, step_4.pt, last.pt (update 4), metrics up to update 4."""
    root = tmp_path_factory.mktemp("agreement")
    directory = root / "run"
    recipe = _recipe(root / "recipe.yaml", directory)
    assert _invoke("train-sl", "--config", str(recipe), "--no-progress") == 0
    assert {p.name for p in directory.glob("*.pt")} == {"step_2.pt", "step_4.pt", "last.pt"}
    return directory


def _trim_metrics(directory: Path, step: int = 2) -> None:
    path = directory / "metrics.jsonl"
    lines = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= step]
    path.write_text("".join(f"{line}\n" for line in lines))


def _only_step_2(d: Path) -> None:
    (d / "step_4.pt").unlink()
    (d / "last.pt").unlink()
    _trim_metrics(d)


def _metrics_ahead(d: Path) -> None:
    (d / "step_4.pt").unlink()
    (d / "last.pt").unlink()


def _later_step_file(d: Path) -> None:
    (d / "last.pt").unlink()
    _trim_metrics(d)


def _last_ahead(d: Path) -> None:  # e.g. a stop's or a save_every_s snapshot, few log lines
    (d / "step_4.pt").unlink()
    _trim_metrics(d)


def _other_run(d: Path) -> None:
    _only_step_2(d)
    run_json = json.loads((d / "run.json").read_text())
    run_json["run_id"] = "0" * 32
    (d / "run.json").write_text(json.dumps(run_json))


def _no_run_json(d: Path) -> None:
    _only_step_2(d)
    (d / "run.json").unlink()


def _no_identity(d: Path) -> None:
    from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint

    _only_step_2(d)
    payload = read_checkpoint(d / "step_2.pt")["payload"]
    payload["run"]["run_id"] = None
    write_checkpoint(make_checkpoint(payload), d / "step_2.pt")


STATES: dict[str, tuple[Callable[[Path], None], bool]] = {
    "nothing beyond the checkpoint": (_only_step_2, True),
    "metrics records beyond it": (_metrics_ahead, False),
    "a later step file": (_later_step_file, False),
    "last.pt ahead of it": (_last_ahead, False),
    "another run's run.json": (_other_run, False),
    "no run.json": (_no_run_json, False),
    "a checkpoint without run identity": (_no_identity, False),
}


@pytest.mark.parametrize("state", list(STATES))
def test_inspect_and_train_agree_on_resuming_in_place(state: str, finished_run: Path,
                                                      tmp_path: Path) -> None:
    change, allowed = STATES[state]
    directory = tmp_path / "run"
    shutil.copytree(finished_run, directory)
    change(directory)
    recipe = _recipe(tmp_path / "recipe.yaml", directory)
    checkpoint = str(directory / "step_2.pt")
    inspected = _invoke("inspect-checkpoint", checkpoint, "--config", str(recipe), "--json")
    assert inspected in (0, 1), f"inspect-checkpoint exited {inspected} (bad input?)"
    trained = _invoke("train-sl", "--config", str(recipe), "--resume", checkpoint,
                      "--no-progress")
    assert trained in (0, 2), f"train-sl exited {trained}"
    assert (inspected == 0) == (trained == 0), (
        f"{state}: inspect-checkpoint says {'may' if inspected == 0 else 'may not'} resume, "
        f"train-sl {'resumed' if trained == 0 else 'refused'}")
    assert (trained == 0) == allowed, f"{state}: expected {'resume' if allowed else 'refusal'}"
