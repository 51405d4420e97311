"""Bad input to the ALOHA benchmark is refused by name (exit 2, nothing recorded or
trained): the simulator not installed, an unknown task, a camera where MuJoCo cannot
render, a dataset of another task."""

from __future__ import annotations

from pathlib import Path

import pytest
from embodichain_models.data.aloha.prepare import prepare

from tests.models.aloha.helpers import tiny_recipe
from tests.support.processes import run_cli, run_python_module, worker_env

HERE = Path(__file__).resolve().parent
PREPARE = "embodichain_models.data.aloha.prepare"


@pytest.fixture(scope="module")
def insertion(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aloha_refusals") / "insertion"
    prepare(root, "insertion", episodes=1, seed=0, log=None)
    return root


def _refused(proc, *needles: str) -> str:
    message = proc.stdout + proc.stderr
    assert proc.returncode == 2, message
    assert "Traceback" not in message, message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


@pytest.mark.slow  # fresh interpreters
def test_without_the_sim_extra_prepare_and_training_name_it(insertion: Path,
                                                              tmp_path: Path) -> None:
    """Catches an ImportError traceback (or exit 1) where gym-aloha, dm_control or MuJoCo
    is missing: both the recording command and train-sl name the extra that installs them,
    and nothing is written."""
    env = worker_env(PYTHONPATH=str(HERE))
    out = tmp_path / "data"
    _refused(run_python_module("without_sim", PREPARE, "--task", "transfer_cube",
                               "--episodes", "1", str(out), env=env, fresh=True),
             "embodichain-models[sim]")
    recipe = tiny_recipe(tmp_path / "r.yaml", insertion, tmp_path / "run",
                         **{"data.task": "insertion"})
    _refused(run_python_module("without_sim", "embodichain", "train-sl", "--config",
                               str(recipe), "--no-progress", env=env, fresh=True),
             "embodichain-models[sim]")
    assert not out.exists() and not (tmp_path / "run" / "last.pt").exists()


def test_an_unknown_task_is_refused_naming_the_known_ones(insertion: Path,
                                                          tmp_path: Path) -> None:
    """Catches a KeyError traceback, or a recipe whose bad task is found only when training
    starts: prepare and validate-config both name the tasks there are."""
    _refused(run_python_module(PREPARE, "--task", "fold_shirt", str(tmp_path / "d")),
             "'fold_shirt'", "transfer_cube, insertion")
    recipe = tiny_recipe(tmp_path / "r.yaml", insertion, tmp_path / "run",
                         **{"data.task": "fold_shirt"})
    _refused(run_cli("validate-config", str(recipe)), "data.task", "'fold_shirt'",
             "transfer_cube, insertion")


@pytest.mark.slow  # fresh interpreters
def test_a_camera_where_mujoco_cannot_render_names_the_opengl_backend(
        insertion: Path, tmp_path: Path) -> None:
    """Catches an OpenGL traceback in the middle of recording or of an evaluation: a camera
    asked for by prepare, or an evaluation that films, is refused before anything runs,
    naming MUJOCO_GL and the backends to choose from."""
    env = worker_env(MUJOCO_GL="disable")
    _refused(run_python_module(PREPARE, "--task", "insertion", "--cameras", "top",
                               str(tmp_path / "d"), env=env, fresh=True),
             "MUJOCO_GL=disable", "egl", "camera 'top'")
    assert not (tmp_path / "d").exists()
    recipe = tiny_recipe(tmp_path / "r.yaml", insertion, tmp_path / "run",
                         **{"data.task": "insertion", "evaluation.videos": 1,
                            "evaluation.env.id": "embodichain_models/AlohaInsertion-v0",
                            "evaluation.env.kwargs.task": "insertion"})
    _refused(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env,
                     fresh=True), "MUJOCO_GL=disable", "camera 'top'")
    assert not (tmp_path / "run" / "last.pt").exists()


def test_a_dataset_of_another_task_is_refused_naming_both(insertion: Path,
                                                           tmp_path: Path) -> None:
    """Catches a policy trained on one task's demonstrations and judged on another's (the
    observation sizes differ, so it would fail deep in the model or silently score 0): the
    dataset's task and the recipe's are both named; so is an evaluation of another task."""
    recipe = tiny_recipe(tmp_path / "r.yaml", insertion, tmp_path / "run")
    _refused(run_cli("train-sl", "--config", str(recipe), "--no-progress"),
             "'insertion'", "data.task 'transfer_cube'", str(insertion))
    recipe = tiny_recipe(tmp_path / "r2.yaml", insertion, tmp_path / "run2",
                         **{"data.task": "insertion"})
    _refused(run_cli("train-sl", "--config", str(recipe), "--no-progress"),
             "evaluation.env", "'transfer_cube'", "data.task is 'insertion'")
