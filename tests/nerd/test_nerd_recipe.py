"""The NeRD recipe through the framework: entry point, schema, and a short training run."""

from __future__ import annotations

import json
import os
import subprocess
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
import yaml
from embodichain_models.dynamics.nerd import sl_recipe
from embodichain_models.dynamics.nerd.prepare import main as prepare

from embodichain.core.runs.measured import is_measured
from tests.support.processes import run_python_module
from tests.support.state_compare import assert_training_state_equal

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples/learning/nerd/configs/cartpole/sl.train.yaml"
TARGET = "embodichain_models.dynamics.nerd.sl_recipe:build_supervised_trainer"


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    # One intra-op thread: these tiny ops only lose from threading, badly so on a busy machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_python_module("embodichain", *args, cwd=cwd or REPO, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nerd-data")
    prepare(["--out", str(out), "--train-trajectories", "500", "--val-trajectories", "50",
             "--steps", "40"])
    return out


def small_recipe(path: Path, data: Path, **changes: object) -> Path:
    """The example recipe on the small data, CI-sized, with `changes` ("a.b": value) applied."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe.update(factory="nerd", device="cpu")
    recipe["data"] = {"train": str(data / "train.pt"), "val": str(data / "val.pt")}
    recipe["trainer"].update(batch_size=128, max_updates=400, validate_every=200, save_every=0,
                             output_dir=str(path.parent / "run"))
    recipe["optimizer"]["lr"] = 0.003
    recipe["scheduler"]["end_lr"] = 0.0003
    recipe["validation"] = {"horizons": [1, 10]}
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = recipe
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_nerd_is_discovered_by_entry_point_from_its_own_distribution() -> None:
    (ep,) = [ep for ep in entry_points(group="embodichain.sl_factories") if ep.name == "nerd"]
    assert ep.value == TARGET
    assert ep.dist is not None and ep.dist.name == "embodichain-models"
    factory = ep.load()
    assert factory is sl_recipe.build_supervised_trainer
    assert factory.config_schema is sl_recipe.NerdConfig
    listed = cli("list-factories")
    assert listed.returncode == 0, listed.stderr
    assert "nerd" in listed.stdout and "embodichain-models" in listed.stdout


def test_example_recipe_names_the_factory_by_module_path() -> None:
    recipe = yaml.safe_load(RECIPE.read_text())
    assert recipe["factory"] == TARGET and recipe["device"] == "auto"
    assert recipe["optimizer"] == {"name": "adam", "lr": 0.001, "grad_clip": 1.0}
    assert recipe["scheduler"] == {"name": "linear", "end_lr": 0.0001}
    assert recipe["trainer"]["batch_size"] == 256 and recipe["trainer"]["max_updates"] == 2500


def test_validate_config_accepts_the_small_recipe(tmp_path: Path, small_data: Path) -> None:
    result = cli("validate-config", str(small_recipe(tmp_path / "r.yaml", small_data)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "run").exists()  # validation never writes


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"data.train": "/nonexistent/train.pt"}, "data.train: file not found"),
        ({"attention.causal": False}, "leaks the answer"),
        ({"precision": "fp16"}, "fp16 is not supported on CPU"),
        pytest.param({"precision": "fp16", "device": "auto"}, "fp16 is not supported on CPU",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present")),
        ({"loss.mask": "last"}, "loss.mask"),
        ({"model.layres": 3}, "did you mean 'layers'"),
        ({"model.heads": 5}, "divisible by heads"),
        ({"normalisation": {"eps": 1e-5}}, "normalisation: unknown key"),
    ],
)
def test_validate_config_checks_the_nerd_schema(
    tmp_path: Path, small_data: Path, changes: dict, expected: str
) -> None:
    result = cli("validate-config", str(small_recipe(tmp_path / "r.yaml", small_data, **changes)))
    assert result.returncode == 2
    assert expected in result.stdout + result.stderr


def test_non_causal_attention_is_fine_with_a_last_position_loss(
    tmp_path: Path, small_data: Path
) -> None:
    recipe = small_recipe(tmp_path / "r.yaml", small_data,
                          **{"attention.causal": False, "loss.mask": "last_position"})
    result = cli("validate-config", str(recipe))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_short_training_run_improves_and_beats_the_baseline(
    tmp_path: Path, small_data: Path
) -> None:
    result = cli("train-sl", "--config", str(small_recipe(tmp_path / "r.yaml", small_data)),
                 "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (tmp_path / "run/metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    validations = {r["step"]: r for r in records if "validation/mse" in r}
    assert sorted(validations) == [200, 400]
    first, last = validations[200], validations[400]
    assert last["validation/mse"] < first["validation/mse"]
    assert last["validation/mse"] < last["validation/baseline_mse"]
    assert last["validation/rollout_mse_h10"] < last["validation/baseline_rollout_mse_h10"]
    # Horizons longer than the 40-step validation trajectories are skipped, not faked.
    assert "validation/rollout_mse_h50" not in last
    for name in ("x", "theta", "x_dot", "theta_dot"):
        assert f"validation/one_step_mse_{name}" in last
        assert f"validation/baseline_one_step_mse_{name}" in last
    assert {"train/loss", "train/mse_theta"} <= set(records[0])
    run = json.loads((tmp_path / "run/run.json").read_text())
    assert run["source_identity"].startswith("nerd-cartpole:window=10:sha256=")


def torchrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # exactness needs a fixed thread count
    return run_python_module("torch.distributed.run", "--standalone", "--nnodes=1",
                             "--nproc-per-node=2", "-m", "embodichain", *args, cwd=REPO,
                             env=env, timeout=timeout)


@pytest.mark.slow
def test_two_worker_resume_is_bitwise_exact(small_data: Path, tmp_path: Path) -> None:
    """A 2-worker NeRD run resumed from its step-20 snapshot ends bitwise where it would have."""
    settings = {"trainer.batch_size": 32, "trainer.max_updates": 40, "trainer.save_every": 20,
                "trainer.validate_every": 20, "trainer.log_every": 10}
    (tmp_path / "a").mkdir()
    recipe_a = small_recipe(tmp_path / "a" / "r.yaml", small_data, **settings)
    done = torchrun("train-sl", "--config", str(recipe_a), "--no-progress")
    assert done.returncode == 0, done.stderr
    run_a = tmp_path / "a" / "run"

    (tmp_path / "b").mkdir()
    recipe_b = small_recipe(tmp_path / "b" / "r.yaml", small_data, **settings)
    resumed = torchrun("train-sl", "--config", str(recipe_b), "--resume",
                       str(run_a / "step_20.pt"), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    run_b = tmp_path / "b" / "run"

    # every part of the state: tensors bitwise, and RNG, sampler, param groups, callbacks
    assert assert_training_state_equal(run_a / "step_40.pt", run_b / "step_40.pt") > 0

    def after_20(run: Path) -> list[dict]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not is_measured(k)}
                for r in records if r["step"] > 20]

    assert after_20(run_a) == after_20(run_b) != []


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_resume_is_refused_when_the_data_file_was_regenerated(tmp_path: Path) -> None:
    """R-RESUME-2: same recipe, same data path, other content (another seed) -> refused, naming
    the source identity and nothing else."""
    data = tmp_path / "data"

    def generate(seed: int) -> None:
        done = run_python_module(
            "embodichain_models.dynamics.nerd.prepare", "--out", str(data),
            "--train-trajectories", "100", "--val-trajectories", "20", "--steps", "20",
            "--seed", str(seed), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    generate(0)
    recipe = small_recipe(tmp_path / "r.yaml", data, **{
        "trainer.batch_size": 16, "trainer.max_updates": 10, "trainer.save_every": 10,
        "trainer.validate_every": 0, "trainer.log_every": 10})
    trained = cli("train-sl", "--config", str(recipe), "--no-progress")
    assert trained.returncode == 0, trained.stdout + trained.stderr
    old = json.loads((tmp_path / "run" / "run.json").read_text())["source_identity"]

    generate(1)  # the same file names, other trajectories
    dest = tmp_path / "resumed"
    refused = cli("train-sl", "--config", str(recipe), "--resume",
                  str(tmp_path / "run" / "step_10.pt"), "--set", f"trainer.output_dir={dest}",
                  "--no-progress")
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out
    assert "Traceback" not in out, out
    listed = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(listed) == 1 and listed[0].startswith(f"  - source identity: checkpoint {old}, "
                                                     "this run nerd-cartpole:"), out
    assert old not in listed[0].split("this run")[1], out  # really other content
    assert not dest.exists()
