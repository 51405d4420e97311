"""The cart-pole behaviour-cloning recipe (embodichain-models[lerobot]): expert swing-up
demonstrations recorded as a LeRobot v3.0 dataset, a policy trained on them through
`train-sl` with the video decoded by DataLoader workers, validated closed-loop.

The runs are tiny (a 32x32 camera, 6 episodes, 16 updates of 8 examples); the reference
(no data workers) is shared by the tests that compare with it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from embodichain_models.data.cartpole.prepare import prepare
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.dynamics.nerd.physics import CartPoleParams
from embodichain_models.envs.cartpole.task import succeeded

from tests.support.processes import run_python_module
from tests.support.state_compare import assert_training_state_equal, comparable_records

TESTS = Path(__file__).resolve().parents[2]
RECOVERY = TESTS / "recovery"  # kill_points.py: SIGKILL the CLI at a chosen call
TIMEOUT = 300
UPDATES = 12


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def cli(*args: str, cwd: Path, module: str = "embodichain", **env: str
        ) -> subprocess.CompletedProcess[str]:
    return run_python_module(module, *args, cwd=cwd, env=_env(**env), timeout=TIMEOUT)


def _ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demonstrations, and beside them the recipe `embodichain init` offers."""
    root = tmp_path_factory.mktemp("bc")
    _ok(cli("init", "cartpole_bc", str(root / "packaged.yaml"), cwd=root))
    return prepare(root / "data", episodes=6, seed=0, size=32)


def _recipe(directory: Path, data: Path, template: Path | None = None, **trainer: object
            ) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    recipe = yaml.safe_load(((template or data).parent / "packaged.yaml").read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update({"batch_size": 8, "max_updates": UPDATES, "save_every": 4,
                              "validate_every": UPDATES, "log_every": 4, "data_workers": 0,
                              "output_dir": str(directory / "run"), **trainer})
    recipe["model"] = {"channels": 8, "hidden": 32}
    recipe["data"].update(root=str(data), val_episodes=2)
    recipe["validation"] = {"max_examples": 32}
    # 16 slots: the hand-written loop's batch (test_the_evaluation_acts_as_the_hand_...).
    recipe["evaluation"].update(episodes=2, max_steps=130, envs_per_rank=16, videos=1)
    recipe["evaluation"]["env"]["kwargs"] = {"size": 32, "render_size": 48}
    path = directory / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def reference(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe trained without data workers, uninterrupted."""
    root = tmp_path_factory.mktemp("bc_reference")
    _ok(cli("train-sl", "--config", str(_recipe(root, dataset)), "--no-progress", cwd=root))
    return root / "run"


def test_prepare_records_successful_demonstrations_as_lerobot_v30(dataset: Path) -> None:
    """Catches another format version or layout, a missing camera video or task, and an
    expert that fails its own task (the demonstrations, recorded with force noise, end
    balanced; the noise may topple one in fifty)."""
    info = json.loads((dataset / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 30
    assert info["features"]["observation.image"]["dtype"] == "video"
    assert (dataset / "videos/observation.image/chunk-000/file-000.mp4").is_file()
    assert pq.read_table(dataset / "meta/tasks.parquet").column("task").to_pylist() == [
        "swing the pole up and balance it"]
    frames = LeRobotFrames(dataset)
    lengths = [e.length for e in frames.episodes]
    assert len(set(lengths)) > 1 and len(frames) == sum(lengths)  # uneven episodes
    states = frames.tables.columns["observation.state"]
    ends = np.cumsum(lengths)
    balanced = [succeeded(torch.from_numpy(states[end - n:end]).double().unsqueeze(0),
                          CartPoleParams()).item()
                for end, n in zip(ends, lengths, strict=True)]
    assert sum(balanced) >= len(balanced) - 1, balanced


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_the_recipe_trains_and_validates_its_success_rate_closed_loop(reference: Path) -> None:
    """Catches a validation that never runs the policy in the simulator, and a best metric
    other than the success rate, maximised; the loss is masked by action_is_pad (some
    examples near an episode's end are padded), so the recorded weight is the number of
    real steps, below batch x chunk."""
    records = comparable_records(reference)
    final = [r for r in records if "validation/success_rate" in r][-1]
    assert final["step"] == UPDATES and 0.0 <= final["validation/success_rate"] <= 1.0
    assert final["validation/expert_success_rate"] == 1.0
    assert "validation/action_mse" in final
    films = sorted((reference / "evaluations" / f"update_{UPDATES:06d}").iterdir())
    assert [f.name for f in films] == ["episode_0000.mp4"]
    run = json.loads((reference / "run.json").read_text())
    assert run["best"]["metric"] == "validation/success_rate" and run["best"]["mode"] == "max"
    weights = [r["train/weight"] for r in records if "train/weight" in r]
    assert weights and all(w <= 8 * 8 for w in weights)


@pytest.mark.slow
def test_the_evaluation_acts_as_the_hand_written_loop(reference: Path, tmp_path: Path) -> None:
    """`embodichain eval` of the trained policy over 16 episodes (the gymnasium environment,
    the policy's chunk execution, the evaluation's slots) against the batched loop it
    replaced (`rollout.run_policy`), same weights and starts: every episode's success and
    return (the sum of cos θ over the states acted on) are equal, bitwise. Catches an
    environment that steps, renders or judges differently (a state off by one step, float32
    physics, the success window), and a policy whose frame history or chunk execution
    drifts from the reference."""
    from embodichain_models.policies.cartpole_bc.policy import ChunkPolicy
    from embodichain_models.policies.cartpole_bc.rollout import evaluation_starts, run_policy

    from embodichain.core.checkpoint.export import checkpoint_model
    from embodichain.core.checkpoint.file import read_checkpoint

    out = tmp_path / "eval"
    _ok(cli("eval", str(reference / "last.pt"), "--episodes", "16", "--videos", "0",
            "--out", str(out), "--no-progress", cwd=tmp_path))
    found = [json.loads(x) for x in (out / "episodes.jsonl").read_text().splitlines()]
    checkpoint = reference / "last.pt"
    state = checkpoint_model(checkpoint, read_checkpoint(checkpoint))
    model = ChunkPolicy(2, 32, 8, 8, 32, torch.ones(3), torch.zeros(1), torch.ones(1))
    model.load_state_dict(state)
    model.eval()
    params = CartPoleParams()
    states = run_policy(model, evaluation_starts(16, 1000), 130, 2, 32, 1, params,
                        torch.device("cpu"))
    assert [r["success"] for r in found] == succeeded(states, params).tolist()
    returns = []
    for episode in torch.cos(states[..., 1]).tolist():  # summed in the evaluation's order
        total = 0.0
        for value in episode:
            total += value
        returns.append(total)
    assert [r["return"] for r in found] == returns


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_two_data_workers_train_the_model_of_none_bitwise(dataset: Path, reference: Path,
                                                          tmp_path: Path) -> None:
    """Catches frames decoded differently in a worker (a decoder shared across the fork,
    seeking that depends on what the process decoded before) and examples other than the
    sampler's: the whole training state equals the run without workers, bitwise."""
    recipe = _recipe(tmp_path, dataset, data_workers=2, prefetch=2)
    _ok(cli("train-sl", "--config", str(recipe), "--no-progress", cwd=tmp_path))
    assert assert_training_state_equal(reference / "last.pt", tmp_path / "run/last.pt") >= 4
    assert comparable_records(tmp_path / "run") == comparable_records(reference)


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_with_another_worker_count_is_exact(
        dataset: Path, reference: Path, tmp_path: Path) -> None:
    """Catches a snapshot that counts the batches the 2 workers had prefetched, or that is
    tied to the worker count: SIGKILLed at update 8 (snapshot of update 4 on disk), then
    resumed without workers, the run ends bitwise as the uninterrupted one."""
    recipe = _recipe(tmp_path, dataset, data_workers=2, prefetch=2)
    point = {"at": "capture", "step": 8}
    killed = cli("train-sl", "--config", str(recipe), "--no-progress", cwd=tmp_path,
                 module="kill_points", PYTHONPATH=str(RECOVERY),
                 EMBODICHAIN_TEST_KILL_POINT=json.dumps(point),
                 EMBODICHAIN_TEST_KILL_MARK=str(tmp_path / "mark"))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert json.loads((tmp_path / "mark").read_text())["step"] == 8
    _ok(cli("resume", str(tmp_path / "run"), "--set", "trainer.data_workers=0",
            "--no-progress", cwd=tmp_path))
    assert assert_training_state_equal(reference / "last.pt", tmp_path / "run/last.pt") >= 4
    assert comparable_records(tmp_path / "run") == comparable_records(reference)


def test_an_undecodable_frame_during_training_exits_1_naming_it(dataset: Path,
                                                                tmp_path: Path) -> None:
    """Catches a decoding failure in a data worker that hangs the run, exits 2 as if the
    recipe were wrong, or names neither the episode, the frame, the file nor where to
    continue."""
    data = Path(shutil.copytree(dataset, tmp_path / "data"))
    video = data / "videos/observation.image/chunk-000/file-000.mp4"
    raw = bytearray(video.read_bytes())
    begin, end = raw.find(b"mdat") + 4, raw.find(b"moov") - 4
    raw[begin:end] = b"\xff" * (end - begin)
    video.write_bytes(bytes(raw))
    recipe = _recipe(tmp_path, data, template=dataset, data_workers=2)
    proc = cli("train-sl", "--config", str(recipe), "--no-progress", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    message = proc.stderr
    assert "loading example" in message and "file-000.mp4" in message, message
    assert "episode " in message and "frame " in message, message
    assert "no snapshot was saved" in message, message


@pytest.mark.slow  # torchrun workers, then eval
def test_under_fsdp_the_emas_weights_act_as_eval_of_the_saved_ema(dataset: Path,
                                                                   tmp_path: Path) -> None:
    """Two ranks under `trainer.strategy: fsdp` with `evaluation.acting: ema`: the closed
    loop at update 4 gives the episodes `eval` of the snapshot gives in one process (it loads
    the saved EMA into the model), bitwise. Catches the policy handed the sharded EMA's
    call-only view instead of a ChunkPolicy, and the model's own weights acting."""
    from tests.support.processes import run_torchrun

    recipe = _recipe(tmp_path, dataset, max_updates=4, save_every=4, validate_every=4,
                     log_every=2, strategy="fsdp", ema={"decay": 0.5})
    data = yaml.safe_load(recipe.read_text())
    data["evaluation"]["acting"] = "ema"
    recipe.write_text(yaml.safe_dump(data))
    _ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", cwd=tmp_path,
                     env=_env(), timeout=TIMEOUT))
    _ok(cli("eval", str(tmp_path / "run" / "last.pt"), "--out", str(tmp_path / "eval"),
            "--no-progress", cwd=tmp_path))

    def episodes(path: Path) -> list[dict]:
        return [{k: v for k, v in json.loads(x).items() if k != "video"}
                for x in path.read_text().splitlines()]

    validated = episodes(tmp_path / "run" / "evaluations" / "update_000004.jsonl")
    assert len(validated) == 2 and validated == episodes(tmp_path / "eval" / "episodes.jsonl")
