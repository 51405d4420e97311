"""The ALOHA ACT recipe (R-ALOHA-1) end to end under torchrun (2 gloo ranks): a tiny recipe
trains on recorded demonstrations, is judged closed-loop in gym-aloha's scene through the
recipe's evaluation section, and resumes bitwise. The chunk execution and the deployable
forward are checked on their own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from embodichain_models.data.aloha.prepare import prepare
from embodichain_models.policies.act.execution import ChunkExecution
from embodichain_models.policies.act.model import ActPolicy, ActShape, objective

from tests.models.aloha.helpers import UPDATES, tiny_recipe
from tests.support.processes import assert_ok, run_torchrun, worker_env
from tests.support.state_compare import assert_training_state_equal, comparable_records


@pytest.fixture(scope="module")
def demonstrations(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aloha_train") / "transfer_cube"
    prepare(root, "transfer_cube", episodes=2, seed=0, log=None)
    return root


@pytest.fixture(scope="module")
def reference(demonstrations: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe trained uninterrupted by 2 ranks."""
    root = tmp_path_factory.mktemp("aloha_reference")
    recipe = tiny_recipe(root / "r.yaml", demonstrations, root / "run")
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress", cwd=root,
                           env=worker_env()))
    return root / "run"


@pytest.mark.slow  # torchrun workers and a simulator
def test_two_ranks_train_and_judge_the_policy_closed_loop(reference: Path) -> None:
    """Catches a recipe whose validation never runs the policy in the MuJoCo scene, or
    without the strict verdicts beside the field's, a best metric other than the strict
    success rate maximised (the field's picks a checkpoint that touches the cube and drops
    it), no best.pt, and a loss not masked by action_is_pad
    (the recorded weight is the number of real steps of the global batch)."""
    records = comparable_records(reference)
    final = [r for r in records if "validation/success_rate" in r][-1]
    assert final["step"] == UPDATES and final["validation/episode_length"] > 0
    assert {"validation/strict_success_rate", "validation/success_300_rate",  # ALOHA's judge
            "validation/strict_success_300_rate"} <= final.keys()
    episodes = [json.loads(line) for line in
                (reference / f"evaluations/update_{UPDATES:06d}.jsonl").read_text().splitlines()]
    assert sorted(e["seed"] for e in episodes if "seed" in e) == [100000, 100001], episodes
    run = json.loads((reference / "run.json").read_text())
    assert run["best"] == {**run["best"], "metric": "validation/strict_success_rate",
                           "mode": "max"}  # the strict verdict selects (R-TRUST-2)
    assert (reference / "best.pt").is_file()
    assert all(0 < r["train/weight"] <= 8 * 10 for r in records if "train/weight" in r)


@pytest.mark.slow
def test_resume_under_two_ranks_is_bitwise(demonstrations: Path, reference: Path,
                                           tmp_path: Path) -> None:
    """Catches state the snapshot misses (the model's normalisation buffers, the sampler,
    the dropout streams of each rank) and an evaluation that depends on what ran before:
    resumed from update 3 into a fresh directory, the run ends bitwise as the uninterrupted
    one, with the same records (closed-loop outcomes included)."""
    recipe = tiny_recipe(tmp_path / "r.yaml", demonstrations, tmp_path / "run")
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume",
                           str(reference / "step_3.pt"), "--no-progress", cwd=tmp_path,
                           env=worker_env()))
    assert assert_training_state_equal(reference / "last.pt", tmp_path / "run/last.pt") >= 1
    after = [r for r in comparable_records(reference) if r["step"] > 3]
    assert [r for r in comparable_records(tmp_path / "run") if r["step"] > 3] == after


@pytest.mark.slow  # torchrun workers and a simulator
def test_under_fsdp_the_emas_weights_act_through_act_chunk(demonstrations: Path,
                                                           tmp_path: Path) -> None:
    """Two ranks under `trainer.strategy: fsdp` with `evaluation.acting: ema`, 2 updates:
    the validation's closed loop runs and the snapshot is written. Catches the policy handed
    the sharded EMA's call-only view ("'_EmaView' object has no attribute 'act_chunk'",
    exit 1, no snapshot)."""
    recipe = tiny_recipe(tmp_path / "r.yaml", demonstrations, tmp_path / "run",
                         **{"trainer.strategy": "fsdp", "trainer.ema": {"decay": 0.9},
                            "trainer.max_updates": 2, "trainer.save_every": 2,
                            "trainer.validate_every": 2, "evaluation.acting": "ema",
                            "evaluation.max_steps": 5})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           cwd=tmp_path, env=worker_env()))
    episodes = [json.loads(line) for line in
                (tmp_path / "run/evaluations/update_000002.jsonl").read_text().splitlines()]
    assert [(e["seed"], e["length"], e["failure"]) for e in episodes] == \
        [(100000, 5, None), (100001, 5, None)]
    assert (tmp_path / "run/last.pt").is_file()


def _model(cvae: bool = False) -> ActPolicy:
    stats = {k: {"mean": torch.linspace(-1, 1, d), "std": torch.linspace(0.5, 2, d)} for k, d
             in (("observation.state", 14), ("observation.environment_state", 7),
                 ("action", 14))}
    torch.manual_seed(0)
    return ActPolicy(ActShape(14, 7, 14, 5, hidden=16, heads=2, feedforward=32, cvae=cvae),
                     stats).eval()


def test_temporal_ensembling_weighs_each_steps_predictions_as_act() -> None:
    """Catches weights in the wrong order (ACT gives the oldest prediction exp(-m * 0)),
    chunks indexed from the wrong step, a slot's history leaking into another slot or
    surviving its reset, and a horizon that re-plans at the wrong steps."""
    calls = []

    def chunk_fn(obs):  # the chunk made at call c predicts 100 c + j for its step j
        calls.append(obs["x"].clone())
        c = len(calls) - 1
        return torch.full((2, 4, 1), 100.0 * c) + torch.arange(4.0).view(1, 4, 1)

    m = 0.5
    ensemble = ChunkExecution(chunk_fn, ["x"], 4, temporal_ensemble=m)
    outputs = [ensemble.act({"x": np.zeros((2, 1), np.float32)})[:, 0] for _ in range(3)]
    predictions = [200.0, 100.0 + 1, 0.0 + 2]  # step 2: made at steps 2, 1, 0 (newest first)
    weights = np.exp(-m * np.arange(3))[::-1]  # oldest (step 0's) weighs exp(0)
    expected = (weights * predictions).sum() / weights.sum()
    assert np.allclose(outputs[2], expected) and outputs[0][0] == 0.0
    ensemble.reset(1)
    after = ensemble.act({"x": np.zeros((2, 1), np.float32)})[:, 0]
    assert after[1] == 300.0 and after[0] != 300.0
    calls.clear()
    follow = ChunkExecution(chunk_fn, ["x"], 4, horizon=2)
    got = [follow.act({"x": np.zeros((2, 1), np.float32)})[0, 0] for _ in range(4)]
    assert got == [0.0, 1.0, 100.0, 101.0] and len(calls) == 2  # a chunk only when due


def test_temporal_ensembling_past_a_chunks_end_is_acts_float64_mean_bit_for_bit() -> None:
    """Catches the ensembling bound off by one (`<=` for `<`: a chunk used one step past its
    end, or a slot's stale history counted after its reset), a window that keeps fewer than
    `chunk` chunks, and float32 ensembling arithmetic (the checkpoint's closed loop and its
    artifact's runner must compute one arithmetic: R-DEPLOY-1's parity): over 11 steps of a
    4-step chunk, a reset of slot 1 at step 6 and random chunks, every action equals the
    float32 of ACT's float64 weighted mean written out here (oldest first), bitwise."""
    chunk, m, steps, reset_at = 4, 0.3, 11, 6
    chunks = np.random.default_rng(0).standard_normal((steps, 2, chunk, 3)).astype(np.float32)
    calls = iter(chunks)
    ensemble = ChunkExecution(lambda obs: torch.from_numpy(next(calls)), ["x"], chunk,
                              temporal_ensemble=m)
    acted = []
    for t in range(steps):
        if t == reset_at:
            ensemble.reset(1)
        acted.append(ensemble.act({"x": np.zeros((2, 1), np.float32)}))
    for t in range(steps):
        for slot, start in ((0, 0), (1, 0 if t < reset_at else reset_at)):
            made = [s for s in range(max(start, t - chunk + 1), t + 1)]  # oldest first
            total, weights = np.zeros(3), 0.0
            for i, s in enumerate(made):
                weight = np.exp(-m * i)
                total = total + weight * chunks[s, slot, t - s].astype(np.float64)
                weights += weight
            want = (total / weights).astype(np.float32)
            assert np.array_equal(acted[t][slot], want), (t, slot, acted[t][slot], want)


def test_the_deployable_forward_is_the_policys_raw_chunk() -> None:
    """Catches normalisation left out of the export (observations or actions), the CVAE
    latent sampled at execution, and an input order other than the interface's."""
    model = _model(cvae=True)
    obs = {"observation.state": torch.randn(3, 14), "observation.environment_state":
           torch.randn(3, 7)}
    keys = list(model.interface()["observations"])
    with torch.no_grad():  # (as acting: the same attention kernels)
        exported = model.deployable()(*(obs[k] for k in keys))
    assert exported.shape == (3, 5, 14) and exported.dtype == torch.float32
    acting = model.acting_copy()  # float64, as the closed loop acts
    assert torch.equal(exported, acting.act_chunk(obs))
    assert torch.equal(acting.act_chunk(obs), acting.act_chunk(obs))
    assert torch.allclose(exported, model.act_chunk(obs), atol=1e-5)
    interface = model.interface()
    assert interface["execution"] == {"temporal_ensemble": 0.01} and interface["fps"] == 50
    batch = {**obs, "action": torch.randn(3, 5, 14),
             "action_is_pad": torch.tensor([[False] * 5, [False] * 3 + [True] * 2,
                                            [True] * 5])}
    result = objective(model.train(), batch)
    assert result.weight.item() == 8 and "kl" in result.metrics


def test_the_acting_forward_and_its_onnx_give_equal_chunks(tmp_path: Path) -> None:
    """Catches an ACT acting in float32, or in float64 with its layer norms' epsilon other
    than the float32 that ONNX's attribute holds (torch and onnxruntime then round some
    chunk entries differently, and a closed loop's trajectories part): on 64 observations
    the exported ONNX forward gives the acting copy's float32 chunks bitwise."""
    import onnxruntime as ort

    from embodichain.core.deploy.artifact import _write_onnx
    from embodichain.core.deploy.interface import normalized_interface
    from embodichain.core.deploy.program import Flat, export_program

    model = _model()
    interface = normalized_interface(model.interface(), "aloha_act")
    keys = list(interface["observations"])
    flat = Flat(model.deployable(), keys).eval()
    _write_onnx(export_program(flat, interface, "ACT"), interface, tmp_path / "act.onnx", "ACT")
    session = ort.InferenceSession(str(tmp_path / "act.onnx"),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    obs = {"observation.state": rng.standard_normal((64, 14)).astype(np.float32),
           "observation.environment_state": rng.standard_normal((64, 7)).astype(np.float32)}
    got = session.run(None, obs)[0]
    want = model.acting_copy().act_chunk({k: torch.from_numpy(v) for k, v in obs.items()})
    assert got.dtype == np.float32 and np.array_equal(got, want.numpy())


def test_training_targets_are_the_deployed_actions_normalised() -> None:
    """Catches ACT's training targets not divided by the action std (`normalised_actions`
    returning `actions - mean`: training, checkpoint, artifact and closed loop then agree
    with each other and every deployed action is off by the std's scale): a demonstration
    whose actions are exactly what the policy deploys (its raw chunk, std 0.5..2 per
    joint) costs it no loss, and so does the float64 acting copy's; an action moved by one
    std costs an L1 of 1/action_dim per step."""
    model = _model()
    obs = {"observation.state": torch.randn(3, 14),
           "observation.environment_state": torch.randn(3, 7)}
    pad = torch.zeros(3, 5, dtype=torch.bool)
    for acting in (model, model.acting_copy()):
        deployed = acting.act_chunk(obs)
        with torch.no_grad():
            result = objective(model, {**obs, "action": deployed, "action_is_pad": pad})
        assert result.metrics["l1"].item() < 1e-5, result.metrics
    moved = deployed.clone()
    moved[..., 3] += model.action_std[3]
    with torch.no_grad():
        result = objective(model, {**obs, "action": moved, "action_is_pad": pad})
    assert abs(result.metrics["l1"].item() - 1 / 14) < 1e-4, result.metrics


def test_a_camera_policy_sees_environment_frames_as_the_dataset_gives_them() -> None:
    """Catches camera frames read in another layout or scale than the dataset's (uint8
    `[B, H, W, 3]` as gym-aloha gives them against float `[B, 3, h, w]` in [0, 1] as the
    dataset decodes them, averaged down by whole blocks), a camera policy that needs the
    objects' poses (gym-aloha's `pixels_agent_pos` has none: read under lerobot's names),
    and a camera path that ignores the image: the executed action is the chunk of the
    converted frame, and another frame changes it."""
    stats = {k: {"mean": torch.zeros(14), "std": torch.ones(14)}
             for k in ("observation.state", "action")}
    torch.manual_seed(0)
    model = ActPolicy(ActShape(14, 0, 14, 3, cameras=("top",), hidden=16, heads=2,
                               feedforward=32, channels=4, image_sizes=((24, 32),),
                               frame_size=(48, 64), image_shift=2), stats).eval()
    assert model.observation_keys() == ["observation.state", "observation.images.top"]
    assert model.interface()["observations"]["observation.images.top"]["dtype"] == "uint8"
    frames = np.random.default_rng(0).integers(0, 256, (2, 48, 64, 3), dtype=np.uint8)
    obs = {"pixels": {"top": frames}, "agent_pos": np.zeros((2, 14))}
    acted = ChunkExecution(model.act_chunk, model.observation_keys(), 3,
                           horizon=3).act(obs)
    image = torch.nn.functional.avg_pool2d(
        torch.from_numpy(frames).permute(0, 3, 1, 2).float() / 255, 2)
    expected = model.act_chunk({"observation.state": torch.zeros(2, 14),
                                "observation.images.top": image})[:, 0]
    assert np.allclose(acted, expected.numpy(), atol=1e-6)
    other = model.act_chunk({"observation.state": torch.zeros(2, 14),
                             "observation.images.top": image.flip(-1)})[:, 0]
    assert not torch.allclose(other, expected)


def test_the_packaged_recipe_is_the_transfer_cube_example() -> None:
    """Catches `embodichain init aloha_act` drifting from the documented example."""
    import yaml

    from embodichain.core.recipe.packaged import recipe_text
    from tests.models.aloha.helpers import EXAMPLE

    assert yaml.safe_load(recipe_text("aloha_act")) == yaml.safe_load(EXAMPLE.read_text())


def test_the_recipes_best_metric_is_the_strict_success_rate_higher_is_better() -> None:
    """Catches the recipe's best metric direction flipped (`min`): best.pt, the summary's
    best, early stopping and `runs` would keep the policy that succeeds least; and the
    field's verdict selecting (a checkpoint that touches the cube and drops it would be the
    best). The example recipe's trainer, rebuilt only to act (no dataset), with the
    factory's own choice (the recipe's `trainer.best` removed), ranks a strict success rate
    of 0.9 above 0.5."""
    import yaml

    from embodichain.core.training.model_facts import rebuilding_to_act
    from embodichain.learning.sl import build_trainer, distributed_run, load_recipe
    from tests.models.aloha.helpers import EXAMPLE

    sizes = (("observation.state", 14), ("observation.environment_state", 7), ("action", 14))
    facts = {"stats": {k: {"mean": [0.0] * d, "std": [1.0] * d} for k, d in sizes},
             "fps": 50, "env_dim": 7, "image_sizes": {}}
    raw = yaml.safe_load(EXAMPLE.read_text())
    assert raw["trainer"].pop("best") == {"metric": "validation/strict_success_rate",
                                          "mode": "max"}
    raw["trainer"].pop("save_best")  # best.pt needs a validation, and none is left here
    raw.pop("evaluation")  # the factory's choice stands without it (no simulator to build)
    with rebuilding_to_act(facts):
        recipe = load_recipe(raw, ["device=cpu", "model.hidden=16", "model.heads=2",
                                   "model.feedforward=32", "data.chunk=5"])
        with distributed_run("cpu") as device:
            trainer = build_trainer(recipe, device)
    assert (trainer.best.metric, trainer.best.mode) == ("validation/strict_success_rate",
                                                        "max")
    assert trainer.best.improves(0.9, 0.5) and not trainer.best.improves(0.5, 0.9)
