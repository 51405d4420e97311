"""The built-in example trained end to end: 2 torchrun workers (gloo) and one process.

Both runs come from the session fixtures in conftest.py (each trains cpu.yaml once).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics
from tests.support import CPU_RECIPE

ARTIFACTS = {"run.json", "metrics.jsonl", "step_100.pt", "step_200.pt", "last.pt"}
RUN_JSON_KEYS = {"run_id", "created_at", "factory", "config_sha256", "source_identity",
                 "world_size", "versions", "environment", "resumed_from"}


@pytest.fixture(params=[2, 1], ids=["torchrun-2-workers", "one-process"])
def trained(request) -> tuple[Path, int]:
    name = "sl_ddp_two_workers" if request.param == 2 else "sl_ddp_one_process"
    return request.getfixturevalue(name), request.param


def validation(run: Path) -> dict[int, float]:
    records = read_metrics(run / "metrics.jsonl").records
    steps = [r["step"] for r in records if "validation/mse" in r]
    assert len(steps) == len(set(steps)), f"validation recorded twice at a step: {steps}"
    return {r["step"]: r["validation/mse"] for r in records if "validation/mse" in r}


def not_json(token: str):
    raise ValueError(f"{token} is not valid JSON")


def test_all_artifacts_exist(trained):
    run, _ = trained
    names = {p.name for p in run.iterdir() if not p.name.startswith(".")}
    assert ARTIFACTS <= names
    assert not [n for n in names if n.endswith(".pt") and n not in ARTIFACTS]  # no pruning,
    # no stray temporaries named *.pt


def test_validation_at_50_100_150_200_and_learning(trained):
    run, _ = trained
    mse = validation(run)
    assert sorted(mse) == [50, 100, 150, 200]
    assert mse[200] < 0.5 * mse[50], mse


def test_run_json_records_identity_and_world_size(trained):
    run, world_size = trained
    identity = json.loads((run / "run.json").read_text())
    assert RUN_JSON_KEYS <= identity.keys(), RUN_JSON_KEYS - identity.keys()
    assert identity["world_size"] == world_size
    assert identity["factory"] == "sl_ddp"
    assert identity["resumed_from"] is None
    assert len(identity["config_sha256"]) == 64
    assert {"python", "torch", "embodichain"} <= identity["versions"].keys()
    assert isinstance(identity["run_id"], str) and identity["run_id"]


def test_checkpoints_hold_their_step_world_size_and_run(trained):
    run, world_size = trained
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    for name, step in [("step_100.pt", 100), ("step_200.pt", 200), ("last.pt", 200)]:
        payload = read_checkpoint(run / name)["payload"]
        assert payload["run"]["step"] == step, name
        assert payload["run"]["world_size"] == world_size, name
        assert payload["run"]["run_id"] == run_id, name
        assert sorted(payload["ranks"]) == list(range(world_size)), name


def test_metrics_lines_are_flat_records_with_integer_steps(trained):
    run, _ = trained
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines
    for line in lines:
        record = json.loads(line, parse_constant=not_json)  # NaN/Infinity are not JSON
        assert isinstance(record["step"], int)
        assert all(not isinstance(v, dict | list) for v in record.values()), record
    losses = [json.loads(line)["step"] for line in lines if "train/loss" in json.loads(line)]
    assert losses == list(range(10, 201, 10))  # log_every: 10


def test_both_world_sizes_learn_each_with_its_own_sampling(sl_ddp_two_workers,
                                                          sl_ddp_one_process):
    """Different world sizes sample differently (R-DIST-4), but both learn the same task."""
    two, one = validation(sl_ddp_two_workers), validation(sl_ddp_one_process)
    assert two.keys() == one.keys()
    assert two != one  # the effective batch and sampling sequence differ with world size
    for mse in (two, one):
        assert mse[50] > mse[100] > mse[150] > mse[200]


def test_the_example_recipe_is_the_documented_one():
    """The integration runs above train exactly the shipped cpu.yaml (R-CFG-6)."""
    import yaml

    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    assert recipe["trainer"] == {"batch_size": 32, "max_updates": 200, "validate_every": 50,
                                 "save_every": 100, "log_every": 10,
                                 "output_dir": "outputs/sl_ddp_cpu"}
    assert recipe["optimizer"] == {"name": "adam", "lr": 0.001}
