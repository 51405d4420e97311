"""Diffusion Policy on the tiny top-camera recording (R-DP-1..3): an example's observation
history padded at an episode's start (R-DP-2), and one short run that trains, is judged on 2
closed-loop episodes with its EMA acting, and exports an artifact giving the checkpoint's
actions for the same noise (R-DP-3)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.models.aloha.test_diffusion import DIFFUSION_EXAMPLE
from tests.support.processes import assert_ok, run_cli
from tests.support.recipes import write_recipe

UPDATES = 4
TINY = {"device": "cpu", "trainer.batch_size": 4, "trainer.global_batch_size": 8,
        "trainer.max_updates": UPDATES, "trainer.save_every": UPDATES,
        "trainer.validate_every": UPDATES, "trainer.log_every": 1, "trainer.data_workers": 1,
        "trainer.ema": {"decay": 0.5}, "scheduler.warmup_updates": 1,
        "model.horizon": 8, "model.n_action_steps": 4, "model.down_dims": [8, 16],
        "model.groups": 4, "model.step_embedding": 8, "model.channels": 4,
        "model.keypoints": 4, "model.image_features": 8, "model.image_shift": 2,
        "model.sampling_steps": 3, "data.val_episodes": 1, "evaluation.episodes": 2,
        "evaluation.max_steps": 6, "evaluation.envs_per_rank": 2}


def test_an_example_holds_the_frames_before_it_the_first_repeated_at_the_start(
        camera_data: Path) -> None:
    """R-DP-2. Catches a history that reads another episode's frames before an episode's
    start (or zeros), one in the wrong order, and a horizon not padded by repeating the
    episode's last action: frame 0 holds [0, 0], frame 1 [0, 1], oldest first, joints and
    camera alike, and the last frame's horizon repeats its action."""
    from embodichain_models.policies.act.data import act_data
    from embodichain_models.policies.diffusion.schema import DiffusionConfig

    config = DiffusionConfig.model_validate(
        {"data": {"root": str(camera_data), "cameras": ["top"], "val_episodes": 1}})
    frames = act_data(config, chunk=16, history=2).held_out  # the second episode, 30 frames
    assert frames is not None
    first, second, last = frames[0], frames[1], frames[29]
    state, image = "observation.state", "observation.images.top"
    assert first[state].shape == (2, 14) and first[image].shape == (2, 3, 24, 32)
    assert first[f"{state}_is_pad"].tolist() == [True, False]
    for key in (state, image):
        assert torch.equal(first[key][0], first[key][1])  # the first frame repeated
        assert torch.equal(second[key][0], first[key][1])
        assert not torch.equal(second[key][1], second[key][0])
    assert last["action"].shape == (16, 14) and last["action_is_pad"][1:].all()
    assert torch.equal(last["action"][15], last["action"][0])


def example_prediction() -> str:
    return yaml.safe_load(DIFFUSION_EXAMPLE.read_text())["model"]["prediction"]


@pytest.fixture(scope="module")
def diffusion_run(camera_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aloha_diffusion_run")
    example = yaml.safe_load(DIFFUSION_EXAMPLE.read_text())
    recipe = write_recipe(root / "r.yaml", root / "run", base=DIFFUSION_EXAMPLE, **TINY,
                          **{"data.root": str(camera_data),
                             "evaluation.env.kwargs": example["evaluation"]["env"]["kwargs"]})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    return root / "run"


def test_a_short_diffusion_run_trains_and_is_judged_in_closed_loop(
        diffusion_run: Path) -> None:
    """R-DP-1. Catches a diffusion recipe that never reaches its closed-loop evaluation
    (the acting policy refusing the camera observation, a history or horizon of the wrong
    shape, an episode failing in the sampler): the run logs its noise loss at every update,
    judges 2 episodes of 6 steps without a fault and validates the held-out error of its prediction,
    and its checkpoint holds the EMA's camera backbone."""
    records = [json.loads(line) for line in (diffusion_run / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records if "train/mse" in r] == list(range(1, UPDATES + 1))
    final = [r for r in records if "validation/success_rate" in r]
    assert final and final[-1]["step"] == UPDATES
    assert final[-1]["validation/episode_length"] == 6
    episodes = [json.loads(line) for line in (diffusion_run / "evaluations" /
                                              f"update_{UPDATES:06d}.jsonl").read_text()
                .splitlines()]
    assert [(e["seed"], e["length"], e["failure"]) for e in episodes] == [
        (100000, 6, None), (100001, 6, None)]
    assert example_prediction() == "sample"  # the example predicts the clean horizon
    assert np.isfinite(final[-1]["validation/sample_mse"])
    from embodichain.core.deploy.trained import trained_model

    model = trained_model(diffusion_run / "last.pt", ema=True).model
    assert "cameras.top.backbone.stages.0.conv1.weight" in model.state_dict()


@pytest.mark.parametrize("suffix", ["pt2", pytest.param("onnx", marks=pytest.mark.slow)])
def test_the_artifact_gives_the_checkpoints_actions_for_the_same_noise(
        diffusion_run: Path, tmp_path: Path, suffix: str) -> None:
    """R-DP-3. Catches an export whose DDIM loop or normalisation differs from the
    checkpoint's (another step count, the noise not an input, the history not stacked), and
    a runner drawing other noise than the checkpoint's policy (another rule, the sample index
    not counted per slot and episode, the episode's seed not heard): `export --policy` of
    the EMA weights takes the 2-frame histories and the declared noise, and gives the
    checkpoint's horizon for them; stepped by the runner, told the episode's seed, it draws
    `episode_noise(seed, k)` for its k-th horizon and acts as the checkpoint's closed-loop
    policy (a torch.export program; ONNX, ~20 s, in the slow suite)."""
    from embodichain.core.deploy.runner import NOISE_RULE, PolicyRunner, episode_noise
    from embodichain.core.deploy.trained import trained_model

    artifact = tmp_path / f"diffusion.{suffix}"
    assert_ok(run_cli("export", str(diffusion_run), "--policy", str(artifact), "--ema"))
    runner = PolicyRunner(artifact)
    specs, interface = runner.interface["observations"], runner.interface
    assert specs["observation.images.top"]["stack"] == 2 and "noise" not in specs
    assert interface["format"] == 2 and interface["noise"] == {
        "key": "noise", "shape": [8, 14], "dtype": "float32", "meaning":
        interface["noise"]["meaning"], **NOISE_RULE}
    assert interface["execution"] == {"horizon": 4}
    rng = np.random.default_rng(2)
    inputs = {"observation.state": rng.normal(size=(2, 2, 14)).astype(np.float32),
              "observation.images.top": rng.integers(0, 256, (2, 2, 480, 640, 3),
                                                     dtype=np.uint8),
              "noise": rng.normal(size=(2, 8, 14)).astype(np.float32)}
    model = trained_model(diffusion_run / "last.pt", ema=True).model
    tensors = {k: torch.from_numpy(v) for k, v in inputs.items()}
    want = model.act_chunk({k: v for k, v in tensors.items() if k != "noise"},
                           tensors["noise"]).numpy()
    got = runner.predict(inputs)
    assert got.shape == (2, 8, 14) and np.allclose(got, want, rtol=1e-4, atol=1e-4)
    # Step by step: the runner keeps the history, executes 4 of each horizon and draws the
    # noise the checkpoint's closed loop draws from the episode's seed.
    from embodichain_models.policies.diffusion.sl_recipe import make_policy

    policy = make_policy(model, torch.device("cpu"))
    policy.reset(0)
    policy.seed_episode(0, 100001)
    runner.reset()
    runner.seed_episode(0, 100001)
    fed = []
    model_of = runner._model
    runner._model = lambda arrays: fed.append(arrays[-1]) or model_of(arrays)
    for step in range(6):
        obs = {"observation.state": inputs["observation.state"][:1, step % 2],
               "observation.images.top": inputs["observation.images.top"][:1, step % 2]}
        mine = policy.act({"agent_pos": obs["observation.state"].astype(np.float64),
                           "pixels": {"top": obs["observation.images.top"]}})
        assert np.allclose(runner.act(obs), mine, rtol=1e-4, atol=1e-4)
    assert len(fed) == 2  # steps 0 and 4
    for k, noise in enumerate(fed):
        assert np.array_equal(noise[0], episode_noise(100001, k, (8, 14)))


def outcomes(records: list[dict]) -> list[tuple]:
    return [(r["episode"], r["seed"], r["success"], r["return"], r["length"], r["end"],
             r["failure"]) for r in records]


def test_eval_of_the_artifact_gives_the_checkpoints_episodes(
        diffusion_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R-DP-3, R-DEPLOY-1. Catches an `eval ARTIFACT` that cannot run a sampler's artifact
    (no noise to give it, gym-aloha's `agent_pos`/`pixels` not found under the dataset's
    names) or runs it with other noise than the checkpoint's (the episode's seed not passed
    on to the runner, or the slot's): `embodichain eval` of the exported EMA policy, in its
    run's environment (2 slots, 2 episodes, the recipe's test seeds: its validation seeds
    are refused to eval), gives the episodes of `eval` of the checkpoint, the actions of
    every step equal to float32 rounding. A declaration of noise the runner cannot draw is
    refused (exit 2)."""
    from embodichain.core.evaluation import episodes
    from tests.support.cli import invoke
    from tests.support.files import doctored_artifact

    artifact = tmp_path / "diffusion.pt2"
    assert_ok(run_cli("export", str(diffusion_run), "--policy", str(artifact), "--ema"))
    acted: dict[str, list[np.ndarray]] = {}
    records: dict[str, Path] = {}
    for name, target in (("checkpoint", diffusion_run), ("artifact", artifact)):
        steps = acted.setdefault(name, [])
        monkeypatch.setattr(episodes, "to_numpy", lambda a, steps=steps: steps.append(
            np.asarray(a)) or steps[-1])
        result = invoke("eval", str(target), "--out", str(tmp_path / name), "--no-progress")
        assert result.exit_code == 0, result.output
        records[name] = tmp_path / name / "episodes.jsonl"
    found = {name: outcomes([json.loads(line) for line in path.read_text().splitlines()])
             for name, path in records.items()}
    assert len(found["artifact"]) == 2
    assert found["artifact"] == found["checkpoint"]
    assert len(acted["artifact"]) == len(acted["checkpoint"]) == 6  # 6 steps of 2 slots
    assert np.allclose(np.stack(acted["artifact"]), np.stack(acted["checkpoint"]),
                       rtol=1e-4, atol=1e-4)

    def uniform(interface: dict) -> None:
        interface["noise"]["kind"] = "uniform"

    bad = doctored_artifact(artifact, tmp_path / "uniform.pt2", uniform)
    proc = run_cli("eval", str(bad), "--out", str(tmp_path / "bad"))
    assert proc.returncode == 2, proc.stderr
    assert "noise declaration" in proc.stderr and "uniform" in proc.stderr
    assert not (tmp_path / "bad").exists()


def test_eval_judges_the_validation_seeds_and_acts_as_set(
        diffusion_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`eval --validation [--set ...]`: how to choose a way of acting on the seeds that
    validation uses, before one test report. Catches --validation judging other seeds or
    otherwise than the run's own validation (its episodes must be the validation's, outcome
    for outcome), a --set that does not reach the acting policy or is not recorded
    (`model.temporal_ensemble` must ensemble a horizon sampled at every step, and
    summary.json name the change), and a change the weights no longer fit judged anyway
    (refused, exit 2, naming the checkpoint, nothing written)."""
    from embodichain.core.deploy import runner
    from tests.support.cli import invoke

    validated = (diffusion_run / "evaluations" / f"update_{UPDATES:06d}.jsonl").read_text()
    result = invoke("eval", str(diffusion_run), "--validation", "--out",
                    str(tmp_path / "plain"), "--no-progress")
    assert result.exit_code == 0, result.output
    assert outcomes([json.loads(line) for line in (tmp_path / "plain" / "episodes.jsonl")
                     .read_text().splitlines()]) == outcomes(
        [json.loads(line) for line in validated.splitlines()])
    assert json.loads((tmp_path / "plain" / "summary.json").read_text())[
        "seed_role"] == "validation"

    ensembled: list[int] = []
    step = runner.TemporalEnsemble.step
    monkeypatch.setattr(runner.TemporalEnsemble, "step", lambda self, chunk: ensembled.append(
        len(chunk)) or step(self, chunk))
    result = invoke("eval", str(diffusion_run), "--validation", "--set",
                    "model.temporal_ensemble=0.5", "--out", str(tmp_path / "te"),
                    "--no-progress")
    assert result.exit_code == 0, result.output
    # the admission check acts once on the first observation, then 6 steps of 2 slots: a
    # horizon per slot at every step
    assert ensembled == [2] * 7, ensembled
    summary = json.loads((tmp_path / "te" / "summary.json").read_text())
    assert summary["recipe_changes"] == ["model.temporal_ensemble=0.5"]
    assert summary["seeds"] == "100000..100001" and summary["seed_role"] == "validation"

    proc = run_cli("eval", str(diffusion_run), "--set", "model.down_dims=[16, 32]", "--out",
                   str(tmp_path / "refit"), "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert "its weights do not fit the recipe as --set model.down_dims=[16, 32]" in proc.stderr
    # in eval's words: which tensor, both shapes, and none of --init-from's remedies
    assert "\n  - " in proc.stderr and "in the model" in proc.stderr, proc.stderr
    assert "--init-" not in proc.stderr and "Nothing was evaluated." in proc.stderr, proc.stderr
    assert not (tmp_path / "refit").exists()
