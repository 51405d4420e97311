"""The ALOHA ACT policy exported with `embodichain export --policy` and driven by the
framework-free runner in the MuJoCo scene acts as its checkpoint does (R-DEPLOY-1): the
same actions and states step by step, bit for bit, on evaluation seeds, hence the same
per-episode outcomes (the short version of benchmarks/aloha_artifact_parity.py).

Tiny: 2 recorded transfer-cube demonstrations, a 32-wide ACT trained for 4 updates,
2 episodes of 40 steps (`embodichain-models[sim]`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.support import assert_ok, run_cli, run_python_module, worker_env
from tests.support.cli import invoke

HERE = Path(__file__).resolve().parent  # without_sim.py

pytestmark = pytest.mark.slow  # a recording, a short run, an ONNX export (~1-2 min)

STEPS = 40
SEEDS = (100000, 100001)  # the recipe's first evaluation seeds


@pytest.fixture(scope="module")
def act_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aloha_export")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    assert_ok(run_python_module("embodichain_models.data.aloha.prepare", "--task",
                                "transfer_cube", "--episodes", "2", str(root / "data"),
                                env=env, timeout=300))
    assert invoke("init", "aloha_act", str(root / "packaged.yaml")).exit_code == 0
    recipe = yaml.safe_load((root / "packaged.yaml").read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update(batch_size=8, max_updates=4, validate_every=0, save_best=False,
                             save_every=4,
                             log_every=4, output_dir=str(root / "run"))
    recipe["trainer"].pop("global_batch_size", None)
    recipe["scheduler"]["warmup_updates"] = 1
    recipe["model"].update(hidden=32, heads=2, feedforward=64)
    recipe["data"].update(root=str(root / "data"), chunk=10)
    recipe["evaluation"].update(episodes=2, max_steps=STEPS, envs_per_rank=1)
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert_ok(run_cli("train-sl", "--config", str(root / "r.yaml"), "--no-progress"))
    return root / "run"


def rollout(policy, seed: int) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """The actions and joint states of one episode the policy drives, its return, and
    whether it succeeded."""
    import embodichain_models.envs  # noqa: F401  (registers the ids)
    import gymnasium as gym

    env = gym.make("embodichain_models/AlohaTransferCube-v0", task="transfer_cube")
    obs, info = env.reset(seed=seed)
    policy.reset(0)
    actions, states, total, success = [], [], 0.0, False
    for _ in range(STEPS):
        batched = {k: np.asarray(v)[None] for k, v in obs.items()}
        action = np.asarray(policy.act(batched))[0]
        obs, reward, terminated, truncated, info = env.step(action)
        actions.append(action)
        states.append(obs["observation.state"])
        total += float(reward)
        success = bool(info.get("is_success", False))
        if terminated or truncated:
            break
    env.close()
    return np.stack(actions), np.stack(states), total, success


def test_aloha_artifact_acts_like_its_checkpoint(act_run: Path) -> None:
    """Catches an exported ACT whose chunks differ from the checkpoint's (normalisation not
    baked in, another chunk length), a runner whose temporal ensembling differs from the
    recipe's (e.g. the newest chunk weighted most, or float32 arithmetic where the
    closed loop's is float64), and a policy acting in float32 (torch and onnxruntime
    then differ in the last bits, and the trajectories part): driven by the runner on
    the evaluation seeds, the ONNX artifact gives the checkpoint policy's actions and
    joint states step by step, bitwise, and its return and success."""
    from embodichain_models.policies.act.sl_recipe import policy_factory

    from embodichain.core.deploy.runner import PolicyRunner
    from embodichain.core.deploy.trained import trained_model

    artifact = act_run.parent / "act.onnx"
    result = invoke("export", str(act_run), "--policy", str(artifact))
    assert result.exit_code == 0, result.output
    runner = PolicyRunner(artifact)
    assert runner.interface["execution"] == {"temporal_ensemble": 0.01}
    assert runner.interface["chunk"] == 10 and runner.interface["fps"] == 50

    model = trained_model(act_run / "last.pt").model
    checkpoint_policy = policy_factory({"temporal_ensemble": 0.01})(model, "cpu")
    for seed in SEEDS:
        want = rollout(checkpoint_policy, seed)
        got = rollout(runner, seed)
        np.testing.assert_array_equal(got[0], want[0])  # actions
        np.testing.assert_array_equal(got[1], want[1])  # joint states
        assert got[2:] == want[2:]  # return, success


def test_the_checkpoint_alone_exports_and_its_demonstration_seeds_are_refused(
        act_run: Path, tmp_path: Path) -> None:
    """R-EVAL-5: with the dataset moved away, `export --policy` runs in a process where
    gym-aloha, dm_control and MuJoCo cannot be imported (catches the factory requiring the
    simulator, or reading the dataset, when the model is only rebuilt). R-EVAL-6: the seeds
    `prepare` recorded the demonstrations with (meta/aloha.json) travel in the checkpoint
    and the artifact; `eval --seed 0` of either, and a training whose evaluation.seed is 0,
    are refused (exit 2) naming them, instead of judging the policy on its own
    demonstrations."""
    root = act_run.parent
    seeds = json.loads((root / "data" / "meta" / "aloha.json").read_text())["seeds"]
    assert 0 in seeds
    artifact = tmp_path / "act.onnx"
    (root / "data").rename(root / "data_gone")
    try:
        assert_ok(run_python_module("without_sim", "embodichain", "export", str(act_run),
                                    "--policy", str(artifact),
                                    env=worker_env(PYTHONPATH=str(HERE)),
                                    fresh=True))
    finally:
        (root / "data_gone").rename(root / "data")
    from embodichain.core.deploy.runner import read_interface

    interface = read_interface(artifact)
    assert interface["chunk"] == 10 and interface["provenance"]["demonstration_seeds"] == seeds
    for target in (act_run, artifact):
        proc = run_cli("eval", str(target), "--seed", "0", "--episodes", "2",
                       "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, proc.stderr
        assert "the training data was recorded with (0" in " ".join(proc.stderr.split())
    proc = run_cli("train-sl", "--config", str(root / "r.yaml"), "--set", "evaluation.seed=0",
                   "--set", f"trainer.output_dir={tmp_path / 'run'}", "--no-progress")
    assert proc.returncode == 2 and "evaluation.seed: evaluation seeds 0..1" in \
        " ".join(proc.stderr.split()), proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "run" / "last.pt").exists()
