"""`trainer.deterministic` (R-DET-1) on CPU: the key validates, every worker applies it (the
environment variables before CUDA or the group start, torch's flags), it changes nothing on
CPU, an operation torch has no deterministic kernel for stops the run by name, and a resume
may change it. What it fixes on CUDA is checked by benchmarks/gpu_check.sh."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from embodichain.core.distributed.determinism import set_environment
from embodichain.core.errors import UsageError
from tests.support import (
    FACTORIES,
    assert_ok,
    factories_env,
    run_cli,
    run_torchrun,
    write_recipe,
)
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_same_outcome

KEY = "trainer.deterministic"
SET_ON = ("--set", f"{KEY}=true")
VARIABLES = ("CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO")
APPLIED = {"env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring"},
           "deterministic_algorithms": True, "cudnn_deterministic": True,
           "cudnn_benchmark": False}


def clean_env(record: Path | None = None, **extra: str) -> dict[str, str]:
    """The test factories' worker environment, without the variables under test (so what a
    worker sees, it set itself) and recording into `record`."""
    env = factories_env(**({"RECORD_DIR": str(record)} if record else {}), **extra)
    for name in VARIABLES:
        if name not in extra:
            env.pop(name, None)
    return env


def records(directory: Path) -> dict[str, dict]:
    """What each rank's build saw (tests/factories/recording.py), by file name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))}


def test_the_key_validates_and_changes_nothing_in_validate_config(tmp_path: Path) -> None:
    """`validate-config` accepts `true` and refuses a non-boolean naming the key (exit 2).
    Catches the key missing from the schema, a lax (coerced) type, and validate-config
    applying the settings to its own process (torch's flags, the environment)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    before = {name: os.environ.get(name) for name in VARIABLES}
    assert_ok(cli_in_process("validate-config", str(recipe), "--build", *SET_ON))
    assert not torch.are_deterministic_algorithms_enabled()
    assert {name: os.environ.get(name) for name in VARIABLES} == before
    bad = cli_in_process("validate-config", str(recipe), "--set", f"{KEY}=1")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert KEY in bad.stdout + bad.stderr


def test_the_environment_is_set_where_unset_and_a_user_value_is_kept_or_refused() -> None:
    """Unset variables get the deterministic values, and so do variables set but empty; a
    user's NCCL_ALGO and a deterministic cuBLAS workspace are kept, each with a note; any
    other workspace is refused naming the variable and value; `false` touches nothing.
    Catches a user value overwritten silently, an empty CUBLAS_WORKSPACE_CONFIG kept empty
    (`if name not in env`) or refused as non-deterministic, a non-deterministic workspace
    accepted, and settings applied when the key is false."""
    env: dict[str, str] = {}
    assert set_environment(True, env) == []
    assert env == APPLIED["env"]

    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "NCCL_ALGO": "^NVLS", "OTHER": "x"}
    notes = set_environment(True, env)
    assert env == {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "NCCL_ALGO": "^NVLS", "OTHER": "x"}
    assert len(notes) == 2 and "NCCL_ALGO=^NVLS" in notes[1] and KEY in notes[1]

    # Set but empty is unset (torch would raise at the first cuBLAS call on CUDA)
    env = {"CUBLAS_WORKSPACE_CONFIG": "", "NCCL_ALGO": ""}
    assert set_environment(True, env) == [] and env == APPLIED["env"]

    with pytest.raises(UsageError, match=r"CUBLAS_WORKSPACE_CONFIG=:0:0.*:4096:8 or :16:8"):
        set_environment(True, {"CUBLAS_WORKSPACE_CONFIG": ":0:0"})
    env = {}
    assert set_environment(False, env) == [] and env == {}


def test_a_deterministic_run_on_cpu_is_the_default_run_bitwise(sl_ddp_one_process: Path,
                                                                tmp_path: Path) -> None:
    """One process with the key on, launched with CUBLAS_WORKSPACE_CONFIG set but empty: its
    build sees torch's deterministic flags and both variables (the empty one replaced), and
    the whole outcome (every snapshot, the metrics) is bitwise the shared run without the
    key. Catches the settings not applied in the training process, the variables set only
    for CUDA devices, and an empty variable kept empty."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="recording:build_supervised_trainer")
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", *SET_ON,
                      env=clean_env(tmp_path, CUBLAS_WORKSPACE_CONFIG="")))
    seen = records(tmp_path)
    assert [{k: v for k, v in r.items() if k != "self_launched"}
            for r in seen.values()] == [APPLIED]
    assert_same_outcome(tmp_path / "run", sl_ddp_one_process, events=[])


@pytest.mark.slow
def test_every_worker_applies_it_under_torchrun_and_self_launch(tmp_path: Path) -> None:
    """Both workers of `torchrun` (train-sl) and of the CLI's own launcher (`resume
    --nproc-per-node 2`, which starts them before reading the recipe) see both variables
    and torch's flags when their factory builds. Catches the settings made by a launcher
    only (plain torchrun has none of ours), on rank 0 only, or only for CUDA devices."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="recording:build_supervised_trainer",
                          **{"trainer.max_updates": 2, "trainer.validate_every": 0,
                             "trainer.save_every": 0, KEY: True})
    for launch in ("torchrun", "self-launch"):
        recorded = tmp_path / launch
        recorded.mkdir()
        if launch == "torchrun":
            proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                                env=clean_env(recorded))
        else:
            proc = run_cli("resume", str(tmp_path / "run"), "--nproc-per-node", "2", "--set",
                           "trainer.max_updates=4", "--no-progress", env=clean_env(recorded))
        assert_ok(proc)
        seen = records(recorded)
        assert sorted(seen) == ["rank0", "rank1"], launch
        for rank, record in seen.items():
            assert record.pop("self_launched") == (launch == "self-launch"), (launch, rank)
            assert record == APPLIED, (launch, rank)


def test_an_operation_without_a_deterministic_kernel_stops_the_run(tmp_path: Path) -> None:
    """A model using max_unpool1d (no deterministic implementation in torch, CPU included):
    with the key on the run stops at update 1 with exit 1 and one paragraph naming the
    operation, the key and how to turn it off, no traceback; without the key it trains.
    Catches torch's RuntimeError left unexplained (`error: RuntimeError: ...`) and the
    flags not applied (the run would train)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          factory="unpooling:build_supervised_trainer",
                          **{"trainer.max_updates": 2, "trainer.validate_every": 0,
                             "trainer.save_every": 0})
    refused = run_cli("train-sl", "--config", str(recipe), "--no-progress", *SET_ON,
                      env=clean_env())
    assert refused.returncode == 1, refused.stdout + refused.stderr
    message = refused.stderr
    assert "error: update 1: the operation max_unpooling2d_forward_out has no deterministic" \
           in message, message
    assert f"{KEY}: true" in message and f"--set {KEY}=false" in message, message
    assert "Traceback" not in message and "RuntimeError" not in message, message
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=clean_env()))


def test_a_non_deterministic_cublas_workspace_is_refused_before_anything(tmp_path: Path
                                                                          ) -> None:
    """`CUBLAS_WORKSPACE_CONFIG` set by the user to a value torch does not accept as
    deterministic: exit 2 naming it, no run directory created. Catches the value replaced
    silently by a deterministic one (the run would train)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", *SET_ON,
                   env=clean_env(CUBLAS_WORKSPACE_CONFIG=":0:0"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "CUBLAS_WORKSPACE_CONFIG=:0:0" in proc.stderr and KEY in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_resume_may_turn_it_on_and_records_it(resumed_at_100: Path, tmp_path: Path) -> None:
    """The shared run at update 100, resumed in place with the key turned on: allowed, the
    `resumed` event records `deterministic: true` (the stored recipe keeps the run's
    original value), and on CPU the result is bitwise the same resume without it. Catches
    the key missing from the resumable changes (refused, exit 2) and a change not
    recorded."""
    run = tmp_path / "run"
    shutil.copytree(resumed_at_100 / "at_100", run)
    assert_ok(run_cli("resume", str(run), "--set", "trainer.max_updates=200", *SET_ON,
                      "--no-progress", env=clean_env()))
    stored = json.loads((run / "run.json").read_text())
    resumed = [e for e in stored["events"] if e["event"] == "resumed"]
    assert [(e["step"], e["deterministic"]) for e in resumed] == [(100, True)]
    assert stored["config"]["trainer"]["deterministic"] is False
    reference = resumed_at_100 / "run"
    assert json.loads((reference / "run.json").read_text())["events"][-1]["deterministic"] \
        is False
    assert_same_outcome(run, reference, events=[("resumed", 100)])


def test_a_programs_process_gets_its_own_settings_back_after_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Programmatic use, in this process: with the key on, the fit runs deterministic (its
    objective sees torch's flag, the factory of `train()` both variables), and when `fit()`
    or `train()` returns, torch's flags, cuDNN's and the environment are the program's again
    (NCCL_ALGO its own value, CUBLAS_WORKSPACE_CONFIG unset). Catches settings left on for
    the rest of the process (every later computation refused or slowed by deterministic
    kernels), and a restore that drops the program's own variable."""
    from embodichain.learning.sl import build_trainer, distributed_run, load_recipe, train
    from embodichain.plugins.sl_ddp import masked_mse

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("RECORD_DIR", str(tmp_path))
    monkeypatch.syspath_prepend(str(FACTORIES))
    before = {"flags": (torch.are_deterministic_algorithms_enabled(),
                        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
              "env": {name: os.environ.get(name) for name in VARIABLES}}
    assert before == {"flags": (False, False, False),
                      "env": {"CUBLAS_WORKSPACE_CONFIG": None, "NCCL_ALGO": "Tree"}}

    def now() -> dict:
        return {"flags": (torch.are_deterministic_algorithms_enabled(),
                          torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark),
                "env": {name: os.environ.get(name) for name in VARIABLES}}

    short = ["trainer.max_updates=2", "trainer.save_every=0", "trainer.validate_every=0",
             f"{KEY}=true"]
    seen: list[bool] = []

    def objective(model, batch):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return masked_mse(model, batch)

    recipe = load_recipe(write_recipe(tmp_path / "a.yaml", tmp_path / "a"), short)
    with distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device)
        trainer.objective = objective
        trainer.fit(show_progress=False)
    assert seen == [True, True]
    assert now() == before

    recipe = load_recipe(write_recipe(tmp_path / "b.yaml", tmp_path / "b",
                                      factory="recording:build_supervised_trainer"), short)
    train(recipe, show_progress=False)
    assert records(tmp_path)["rank0"]["env"] == {"CUBLAS_WORKSPACE_CONFIG": ":4096:8",
                                                 "NCCL_ALGO": "Tree"}
    assert records(tmp_path)["rank0"]["deterministic_algorithms"] is True
    assert now() == before
