"""Data that moved between a run's start and its resume (R-PREEMPT-3): the same LeRobot
dataset at another path (another mount point), and one part of a mixture moved, resume
exactly; run.json records the new path. The source identity is the data's content, so the
recipe's path is only where it lies (`data.root` and each `data.mixture.N.root` are marked
LOCATES_DATA in the recipe's schema).

Each run is the cart-pole recipe (16 px camera, 8 updates, no closed-loop validation); a copy
of it at update 4 (later snapshots removed) is resumed with the data moved, and must end
bitwise as the run never interrupted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from embodichain_models.data.cartpole.prepare import prepare

from tests.support.processes import run_python_module
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # a few training runs


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return run_python_module("embodichain", *args, cwd=cwd, env=env, timeout=300)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two datasets under mount1/ and the recipe `embodichain init` offers."""
    root = tmp_path_factory.mktemp("moved")
    ok(cli("init", "cartpole_bc", str(root / "packaged.yaml"), cwd=root))
    prepare(root / "mount1" / "a", episodes=4, seed=0, size=16)
    prepare(root / "mount1" / "b", episodes=4, seed=1, size=16)
    return root


def recipe(root: Path, name: str, run: Path, data: dict) -> Path:
    config = yaml.safe_load((root / "packaged.yaml").read_text())
    config["device"] = "cpu"
    config["trainer"].update({"batch_size": 8, "max_updates": 8, "save_every": 4,
                              "validate_every": 0, "log_every": 2, "data_workers": 0,
                              "output_dir": str(run), "best": None, "save_best": False})
    config["model"] = {"channels": 4, "hidden": 16}
    if "evaluation" in config:  # never run (validate_every 0), but checked against the data
        config["evaluation"]["env"]["kwargs"] = {"size": 16}
    config["data"] = {**{k: v for k, v in config["data"].items()
                         if k not in ("root", "mixture")}, "val_episodes": 1, **data}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_then_move(root: Path, name: str, data: dict, moved: dict | list[str], what: str,
                  to: str) -> tuple[Path, Path, str]:
    """Train `name` uninterrupted to 8; copy it at update 4; move the data (`what`, under
    root, to `to`: the old path is gone) and resume the copy: `train-sl --resume auto` with
    the recipe `moved` names the new paths in, or (a list) `resume RUN_DIR` with those
    arguments; move it back. The uninterrupted run, the copy, the resume's output."""
    reference = root / f"{name}_reference"
    ok(cli("train-sl", "--config", str(recipe(root, name, reference, data)), "--no-progress",
           cwd=root))
    run = root / f"{name}_resumed"
    shutil.copytree(reference, run)
    for snapshot in ("step_8.pt", "last.pt"):
        (run / snapshot).unlink()
    (root / to).parent.mkdir(parents=True, exist_ok=True)
    shutil.move(root / what, root / to)
    try:
        proc = ok(cli("resume", str(run), *moved, "--no-progress", cwd=root)
                  if isinstance(moved, list) else
                  cli("train-sl", "--config", str(recipe(root, f"{name}_moved", run, moved)),
                      "--resume", "auto", "--no-progress", cwd=root))
    finally:
        shutil.move(root / to, root / what)
    return reference, run, proc.stdout + proc.stderr


def test_a_dataset_at_another_mount_point_resumes_exactly(root: Path) -> None:
    """`resume RUN_DIR --set data.root=NEW`. Catches a refusal of the same data at another
    path (`data.root: checkpoint '.../mount1/a', this run '.../mount2/a'`) though its
    identity is the checkpoint's, a resume that continues inexactly, and run.json not saying
    where the data is now."""
    old, new = str(root / "mount1" / "a"), str(root / "mount2" / "a")
    reference, run, output = run_then_move(root, "single", {"root": old},
                                           ["--set", f"data.root={new}"], "mount1", "mount2")
    assert f"the data moved (its source identity is the checkpoint's): data.root: {old} -> " \
        f"{new}" in output, output
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 4
    assert comparable_records(run) == comparable_records(reference)
    identity = json.loads((run / "run.json").read_text())
    assert identity["config"]["data"]["root"] == new
    resumed = [e for e in identity["events"] if e["event"] == "resumed"][-1]
    assert resumed["data_moved"] == {"data.root": {"from": old, "to": new}}


def test_a_moved_mixture_part_resumes_exactly(root: Path) -> None:
    """Catches a mixture whose part moved refused as a changed list (the part's root is
    only where it lies), and a move recorded without the part's index: part 1 moves to
    another mount point, part 0 stays."""
    def parts(mount: str) -> dict:
        return {"mixture": [{"name": "sim", "root": str(root / "mount1" / "a"), "weight": 3},
                            {"name": "real", "root": str(root / mount / "b"), "weight": 1}]}

    old, new = str(root / "mount1" / "b"), str(root / "mount3" / "b")
    reference, run, output = run_then_move(root, "mixture", parts("mount1"), parts("mount3"),
                                           "mount1/b", "mount3/b")
    assert f"data.mixture.1.root: {old} -> {new}" in output, output
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 4
    assert comparable_records(run) == comparable_records(reference)
    identity = json.loads((run / "run.json").read_text())
    assert identity["config"]["data"]["mixture"][1]["root"] == new
    resumed = [e for e in identity["events"] if e["event"] == "resumed"][-1]
    assert resumed["data_moved"] == {"data.mixture.1.root": {"from": old, "to": new}}
