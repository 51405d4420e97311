"""The ALOHA camera policy (R-ALOHA-3) sees exactly gym-aloha's `pixels_agent_pos` (the top
camera's 480x640 frame and the 14 joint positions): it acts in gym-aloha's own registered
environment unchanged, our top-camera environment gives that environment's observations bit
for bit, and a short camera run records, trains, evaluates and exports (the artifact takes
the camera's uint8 frame as it comes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tests.models.aloha.helpers import EXAMPLE, tiny_recipe
from tests.support.processes import assert_ok, run_cli

CAMERA_EXAMPLE = EXAMPLE.with_name("transfer_cube_camera.yaml")
SEED = 100000


def camera_policy(image_size: tuple[int, int] = (24, 32)):
    """A small untrained camera policy, acting as the recipe's evaluation makes it act."""
    from embodichain_models.policies.act.model import ActPolicy, ActShape
    from embodichain_models.policies.act.sl_recipe import policy_factory

    stats = {k: {"mean": torch.full((14,), 0.1), "std": torch.full((14,), 0.5)}
             for k in ("observation.state", "action")}
    torch.manual_seed(0)
    model = ActPolicy(ActShape(14, 0, 14, 5, cameras=("top",), hidden=16, heads=2,
                               feedforward=32, channels=4, image_sizes=(image_size,)),
                      stats).eval()
    return model, policy_factory({"temporal_ensemble": 0.01})(model, torch.device("cpu"))


def batched(space, obs):
    """One observation as the evaluation batches it for a slot (gymnasium's utilities)."""
    from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

    return concatenate(batch_space(space, 1), [obs], create_empty_array(space, 1))


def test_the_camera_policy_acts_in_gym_alohas_own_environment() -> None:
    """Catches a camera policy that cannot take gym-aloha's `pixels_agent_pos` observation
    (nested `pixels`/`agent_pos`, a 480x640 uint8 frame, float64 joints) and an environment
    of ours whose top camera differs from gym-aloha's (another size, the scene's effects
    off, another camera): one step in `gym_aloha/AlohaTransferCube-v0` and in ours from the
    same seed gives equal frames, joints and policy actions."""
    import embodichain_models.envs  # noqa: F401  (registers our ids)
    import gym_aloha  # noqa: F401  (registers gym-aloha's)
    import gymnasium as gym

    _, policy = camera_policy((120, 160))
    theirs = gym.make("gym_aloha/AlohaTransferCube-v0", obs_type="pixels_agent_pos")
    ours = gym.make("embodichain_models/AlohaTransferCube-v0", task="transfer_cube",
                    obs_type="pixels_agent_pos")
    assert ours.observation_space == theirs.observation_space
    actions = []
    for env in (theirs, ours):
        obs, _ = env.reset(seed=SEED)
        assert obs["pixels"]["top"].shape == (480, 640, 3)
        policy.reset(0)
        action = policy.act(batched(env.observation_space, obs))
        assert action.shape == (1, 14) and np.isfinite(action).all()
        obs, *_ = env.step(action[0])
        actions.append((obs, policy.act(batched(env.observation_space, obs))))
        env.close()
    (a_obs, a_act), (b_obs, b_act) = actions
    assert np.array_equal(a_obs["agent_pos"], b_obs["agent_pos"])
    assert np.array_equal(a_obs["pixels"]["top"], b_obs["pixels"]["top"])
    assert np.array_equal(a_act, b_act)


def test_the_camera_recipe_reads_no_object_pose_and_sees_gym_alohas_camera() -> None:
    """Catches a camera recipe that feeds the objects' poses, an evaluation that renders
    something else than what the policy reads, and a policy that refuses gym-aloha's frame
    size: the example's evaluation observes pixels_agent_pos, and its policy's interface is
    the 14 joint positions and the top camera's uint8 480x640 frame."""
    recipe = yaml.safe_load(CAMERA_EXAMPLE.read_text())
    assert recipe["data"]["cameras"] == ["top"]
    assert recipe["evaluation"]["env"]["kwargs"]["obs_type"] == "pixels_agent_pos"
    model, _ = camera_policy()
    interface = model.interface()["observations"]
    assert interface == {**interface,
                         "observation.state": {**interface["observation.state"],
                                               "shape": [14], "dtype": "float32"},
                         "observation.images.top": {**interface["observation.images.top"],
                                                    "shape": [480, 640, 3], "dtype": "uint8"}}
    assert set(interface) == {"observation.state", "observation.images.top"}


# -- a short camera run: record, train, evaluate, export ------------------------------------


@pytest.fixture(scope="module")
def camera_run(camera_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("aloha_camera_run")
    example = yaml.safe_load(CAMERA_EXAMPLE.read_text())
    recipe = tiny_recipe(root / "r.yaml", camera_data, root / "run", **{
        "data.cameras": ["top"], "model.channels": 4, "model.image_shift": 2,
        "trainer.max_updates": 4, "trainer.validate_every": 4, "trainer.save_every": 4,
        "trainer.data_workers": 1,
        "evaluation.env.kwargs": example["evaluation"]["env"]["kwargs"],
        "evaluation.episodes": 1, "evaluation.max_steps": 3})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    return root / "run"


@pytest.mark.slow  # renders 60 frames at 480x640 and an episode in the top-camera env (~40 s)
def test_a_short_camera_run_trains_and_is_judged_from_the_camera(camera_run: Path) -> None:
    """Catches a camera recipe that never reaches its closed-loop evaluation (the policy
    refusing the environment's pixels_agent_pos observation, or the data's camera) and one
    that trains on the objects' poses: the run validates on its episode and its weights
    have a camera backbone and no object-pose input."""
    records = [json.loads(line) for line in (camera_run / "metrics.jsonl").read_text()
               .splitlines()]
    final = [r for r in records if "validation/success_rate" in r]
    assert final and final[-1]["step"] == 4 and final[-1]["validation/episode_length"] == 3
    from embodichain.core.deploy.trained import trained_model

    names = " ".join(trained_model(camera_run / "last.pt").model.state_dict())
    assert "cameras.top.stages" in names and "env_in" not in names and "env_mean" not in names


@pytest.mark.slow  # an ONNX export of the ResNet
def test_the_exported_camera_policy_takes_the_camera_frame_as_it_comes(
        camera_run: Path, tmp_path: Path) -> None:
    """Catches camera preprocessing left out of the artifact (a robot would have to resize
    and normalise as the training code does): the ONNX policy takes the uint8 480x640 frame
    and gives the checkpoint's chunk."""
    from embodichain.core.deploy.runner import PolicyRunner
    from embodichain.core.deploy.trained import trained_model

    artifact = tmp_path / "camera.onnx"
    assert_ok(run_cli("export", str(camera_run), "--policy", str(artifact)))
    runner = PolicyRunner(artifact)
    spec = runner.interface["observations"]["observation.images.top"]
    assert spec["shape"] == [480, 640, 3] and spec["dtype"] == "uint8"
    rng = np.random.default_rng(1)
    obs = {"observation.state": rng.normal(size=(2, 14)).astype(np.float32),
           "observation.images.top": rng.integers(0, 256, (2, 480, 640, 3), dtype=np.uint8)}
    model = trained_model(camera_run / "last.pt").model
    want = model.act_chunk({k: torch.from_numpy(v) for k, v in obs.items()}).numpy()
    assert np.allclose(runner.predict(obs), want, rtol=1e-5, atol=1e-5)
    # And `eval` of the artifact acts in the recipe's gym-aloha environment (its agent_pos and
    # pixels found at the interface's declared source) with the checkpoint's episodes: catches
    # an ACT interface without `source` (refused: observation.state missing).
    found = {}
    for name, target in (("checkpoint", camera_run), ("artifact", artifact)):
        assert_ok(run_cli("eval", str(target), "--episodes", "2", "--out", str(tmp_path / name),
                          "--no-progress"))
        found[name] = [{k: e[k] for k in ("seed", "success", "return", "length")}
                       for e in map(json.loads, (tmp_path / name / "episodes.jsonl")
                                    .read_text().splitlines())]
    assert len(found["artifact"]) == 2 and found["artifact"] == found["checkpoint"]


def test_a_policy_judged_on_other_observations_than_it_reads_is_refused() -> None:
    """Catches a camera policy evaluated in the state environment (it would fail every
    episode on a missing key, or read object poses) and a state policy in a camera one:
    both refused naming obs_type; gym-aloha's own id is accepted for the camera policy."""
    from types import SimpleNamespace

    from embodichain_models.envs.aloha.tasks import TASKS
    from embodichain_models.policies.act.data import check_evaluation

    from embodichain.learning.sl import UsageError

    def config(cameras: list[str], env_id: str, **kwargs: object) -> SimpleNamespace:
        env = SimpleNamespace(id=env_id, kwargs=kwargs)
        return SimpleNamespace(data=SimpleNamespace(cameras=cameras),
                               evaluation=SimpleNamespace(env=env, videos=0))

    task = TASKS["transfer_cube"]
    for bad in (config(["top"], task.gym_id, task="transfer_cube"),
                config(["top"], task.gym_aloha_id),
                config([], task.gym_id, obs_type="pixels_agent_pos")):
        with pytest.raises(UsageError, match="obs_type"):
            check_evaluation(bad, task)
    check_evaluation(config(["top"], task.gym_aloha_id, obs_type="pixels_agent_pos"), task)
    check_evaluation(config([], task.gym_id, task="transfer_cube"), task)


def test_the_backbone_standardises_images_with_imagenets_statistics() -> None:
    """Catches the image multiplied by the std instead of divided (or the mean left in): an
    image of ImageNet's mean plus one std in each channel reaches the first convolution as
    ones, and one of the mean as zeros."""
    from embodichain_models.policies.vision.backbone import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        ResNetEncoder,
    )

    encoder = ResNetEncoder(4, 8, (32, 32))
    seen: list[torch.Tensor] = []
    encoder.stem[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1).expand(2, 3, 32, 32)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        tokens = encoder(torch.cat([mean[:1] + std, mean[1:]]))
    assert tokens.shape == (2, 1, 8)
    assert torch.allclose(seen[0][0], torch.ones(3, 32, 32), atol=1e-6)
    assert torch.allclose(seen[0][1], torch.zeros(3, 32, 32), atol=1e-6)


def test_a_camera_policy_asked_for_another_camera_than_the_top_one_is_refused() -> None:
    """Catches the refusal of a camera policy evaluated with another camera than the one
    gym-aloha's `pixels_agent_pos` gives (the top one) dropped: a policy recorded from
    `left_wrist` would be judged on the top camera's frames (or fail every episode on a
    missing key). Refused by the recipe's check, naming data.cameras, and by the
    environment."""
    from types import SimpleNamespace

    from embodichain_models.envs.aloha.env import AlohaEnv
    from embodichain_models.envs.aloha.tasks import TASKS
    from embodichain_models.policies.act.data import check_evaluation

    from embodichain.learning.sl import UsageError

    task = TASKS["transfer_cube"]

    def config(cameras: list[str]) -> SimpleNamespace:
        env = SimpleNamespace(id=task.gym_aloha_id, kwargs={"obs_type": "pixels_agent_pos"})
        return SimpleNamespace(data=SimpleNamespace(cameras=cameras),
                               evaluation=SimpleNamespace(env=env, videos=0))

    for cameras in (["left_wrist"], ["top", "angle"]):
        with pytest.raises(UsageError, match=re.escape(f"data.cameras {cameras}: a camera")):
            check_evaluation(config(cameras), task)
    with pytest.raises(ValueError, match="top camera, not cameras \\['left_wrist'\\]"):
        AlohaEnv(obs_type="pixels_agent_pos", cameras=["left_wrist"])
