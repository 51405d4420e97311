"""Diffusion Policy's parts (R-DP-1, R-DP-3), without data or a simulator: the noise schedule
against its closed-form formulas, a horizon the U-Net cannot halve refused at start, each
slot's observation history across a reset, and DDIM sampling that depends on the episode's
seed only (not on the slot, the batch or earlier calls)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.processes import REPO
from tests.support.recipes import write_recipe

DIFFUSION_EXAMPLE = REPO / "examples" / "learning" / "aloha" / "transfer_cube_diffusion.yaml"


def _alpha_bar(s: float) -> float:
    return math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2


def test_the_noise_levels_are_the_squared_cosine_schedule() -> None:
    """Catches a schedule that is not the squared cosine's (a linear one, a shifted index,
    float32 accumulation): below the cap, abar_t = alpha_bar((t+1)/T) / alpha_bar(0)."""
    from embodichain_models.policies.diffusion.noise import NoiseSchedule

    schedule = NoiseSchedule(100)
    betas = schedule.betas.numpy()
    assert betas.shape == (100,) and betas.max() == 0.999 and np.argmax(betas) == 99
    for t in (0, 1, 10, 50, 98):  # the last beta is capped at 0.999, these are not
        assert math.isclose(float(schedule.alphas_cumprod[t]),
                            _alpha_bar((t + 1) / 100) / _alpha_bar(0), rel_tol=1e-12)
        assert math.isclose(betas[t], 1 - _alpha_bar((t + 1) / 100) / _alpha_bar(t / 100),
                            rel_tol=1e-12)


def test_ddpm_noise_and_the_ddim_step_are_the_closed_form() -> None:
    """Catches a forward process or reverse step off the formulas (sqrt forgotten, the
    previous level miscounted, the final level's abar not 1): noising is sqrt(abar) x0 +
    sqrt(1 - abar) eps; a DDIM step from t given the true noise lands exactly on the noised
    sample of the previous level, and the last step returns the clean sample."""
    from embodichain_models.policies.diffusion.noise import NoiseSchedule

    schedule = NoiseSchedule(100, clip_sample=1.0)
    gen = torch.Generator().manual_seed(0)
    x0 = torch.rand(3, 16, 14, generator=gen, dtype=torch.float64) * 1.8 - 0.9
    eps = torch.randn(3, 16, 14, generator=gen, dtype=torch.float64)
    t = torch.tensor([0, 40, 99])
    abar = schedule.alphas_cumprod[t].reshape(3, 1, 1)
    assert torch.allclose(schedule.add_noise(x0, eps, t),
                          abar.sqrt() * x0 + (1 - abar).sqrt() * eps, rtol=0, atol=1e-12)
    assert schedule.ddim_timesteps(10) == [90, 80, 70, 60, 50, 40, 30, 20, 10, 0]
    level = lambda t: torch.full((3,), t)  # noqa: E731
    x_t = schedule.add_noise(x0, eps, level(90))
    assert torch.allclose(schedule.ddim_step(eps, 90, x_t, 10),
                          schedule.add_noise(x0, eps, level(80)), rtol=0, atol=1e-12)
    x_0 = schedule.add_noise(x0, eps, level(0))
    assert torch.allclose(schedule.ddim_step(eps, 0, x_0, 10), x0, rtol=0, atol=1e-12)
    wild = schedule.ddim_step(eps * 0, 0, x_0 * 10, 10)  # the estimate is clipped to +-1
    assert wild.abs().max() <= 1.0


def test_a_sample_predicting_unet_steps_ddim_through_the_noise_it_implies() -> None:
    """Catches sample prediction wired as if the U-Net gave the noise (or the noise's
    formula off): the noise implied by the true clean sample is the noise that was added,
    and a policy whose U-Net returns the clean horizon lands on it (clipped, in [-1, 1])."""
    from embodichain_models.policies.diffusion.model import DiffusionPolicy, DiffusionShape
    from embodichain_models.policies.diffusion.noise import NoiseSchedule

    schedule = NoiseSchedule(100, clip_sample=1.0)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.rand(2, 16, 14, generator=gen, dtype=torch.float64) * 1.8 - 0.9
    eps = torch.randn(2, 16, 14, generator=gen, dtype=torch.float64)
    for t in (0, 50, 99):
        x_t = schedule.add_noise(x0, eps, torch.full((2,), t))
        assert torch.allclose(schedule.epsilon_of(x0, t, x_t), eps, rtol=0, atol=1e-9)

    stats = {key: {"min": [-1.0] * 14, "max": [1.0] * 14}
             for key in ("observation.state", "action")}
    policy = DiffusionPolicy(DiffusionShape(14, 0, 14, prediction="sample"), stats).eval()
    clean = x0.float()
    policy.unet.forward = lambda x, level, condition: clean  # an oracle of the sample
    observations = {"observation.state": torch.zeros(2, 2, 14)}
    out = policy.act_chunk(observations, torch.randn(2, 16, 14, generator=gen))
    assert torch.allclose(out, clean, rtol=0, atol=1e-4)
    assert torch.equal(policy.target(clean, eps.float()), clean)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("model.horizon", 14, "model.horizon (14) must be a multiple of 4"),
    ("model.horizon", 15, "model.horizon (15) must be a multiple of 4"),
    ("model.groups", 5, "width 64 is not a multiple of model.groups (5)")])
def test_a_unet_shape_that_cannot_be_built_is_refused_naming_the_key(
        tmp_path: Path, key: str, value: int, message: str) -> None:
    """Catches an odd horizon reaching the U-Net (a shape error deep in a skip's
    concatenation, or a silently cropped horizon) and GroupNorm groups that do not divide a
    width (torch's error at build time): refused at start, exit 2, naming the key, and no
    run directory made."""
    from tests.support.cli import invoke

    root = tmp_path / "data"
    (root / "meta").mkdir(parents=True)
    (root / "meta" / "info.json").write_text("{}")
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", base=DIFFUSION_EXAMPLE,
                          **{"data.root": str(root), key: value})
    result = invoke("train-sl", "--config", str(recipe), "--no-progress")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "run").exists()


def tiny_policy(**changes: object):
    from embodichain_models.policies.diffusion.model import DiffusionPolicy, DiffusionShape

    stats = {k: {"min": torch.full((14,), -1.0), "max": torch.full((14,), 1.5)}
             for k in ("observation.state", "action")}
    torch.manual_seed(0)
    shape = DiffusionShape(14, 0, 14, ("top",), ((24, 32),), channels=4, keypoints=4,
                           image_features=8, down_dims=(8, 16), groups=4, step_embedding=8,
                           horizon=8, n_action_steps=4, sampling_steps=3, **changes)
    return DiffusionPolicy(shape, stats).eval()


def observation(rng: np.random.Generator, batch: int) -> dict[str, np.ndarray]:
    return {"agent_pos": rng.normal(size=(batch, 14)),
            "pixels": {"top": rng.integers(0, 256, (batch, 480, 640, 3), dtype=np.uint8)}}


def test_joint_noise_perturbs_training_only() -> None:
    """`model.state_noise`. Catches noise that also reaches acting (the evaluation and the
    artifact would then differ from run to run) or that never reaches training: in train
    mode the joints' part of the condition moves by about the asked deviation, the camera's
    part not at all; in eval mode the condition is the noiseless one."""
    noisy, clean = tiny_policy(state_noise=0.5), tiny_policy()
    rng = np.random.default_rng(0)
    batch = {"observation.state": torch.from_numpy(rng.normal(size=(64, 2, 14))).float(),
             "observation.images.top": torch.from_numpy(
                 rng.integers(0, 256, (64, 2, 24, 32, 3), dtype=np.uint8))}
    reference = clean.condition(batch).reshape(64, 2, -1)
    assert torch.equal(noisy.condition(batch).reshape(64, 2, -1), reference)  # eval mode
    noisy.train()
    trained = noisy.condition(batch).reshape(64, 2, -1)
    joints = trained[..., :14] - reference[..., :14]
    assert abs(float(joints.std()) - 0.5) < 0.05
    assert torch.equal(trained[..., 14:], reference[..., 14:])


def test_withheld_joints_are_zeroed_and_flagged_in_training_only() -> None:
    """`model.state_dropout`. Catches joints withheld when acting (the closed loop would run
    blind to the arms), withheld per frame rather than per example (the other frame would
    give them away), or unflagged (a zeroed pose reads as a real one): in eval mode every
    frame's flag is 1 and the joints are the plain policy's; in train mode about the asked
    share of examples has both frames' joints and flags zeroed, the rest untouched."""
    dropping = tiny_policy(state_dropout=0.5)
    rng = np.random.default_rng(0)
    batch = {"observation.state": torch.from_numpy(rng.normal(size=(256, 2, 14))).float(),
             "observation.images.top": torch.from_numpy(
                 rng.integers(0, 256, (256, 2, 24, 32, 3), dtype=np.uint8))}
    reference = tiny_policy().condition(batch).reshape(256, 2, -1)
    acting = dropping.condition(batch).reshape(256, 2, -1)
    assert acting.shape[-1] == reference.shape[-1] + 1  # the flag
    assert torch.equal(acting[..., :14], reference[..., :14])
    assert torch.equal(acting[..., 14], torch.ones(256, 2))
    dropping.train()
    trained = dropping.condition(batch).reshape(256, 2, -1)
    withheld = trained[..., 14] == 0
    assert torch.equal(withheld[:, 0], withheld[:, 1])  # whole examples
    assert 0.4 < float(withheld[:, 0].float().mean()) < 0.6
    assert torch.equal(trained[withheld][:, :14], torch.zeros(int(withheld.sum()), 14))
    kept = ~withheld
    assert torch.equal(trained[kept][:, :14], reference[kept][:, :14])
    assert torch.equal(trained[kept][:, 14], torch.ones(int(kept.sum())))


class FixedMaps(torch.nn.Module):
    def __init__(self, maps: torch.Tensor) -> None:
        super().__init__()
        self.maps = maps

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.maps  # [N, cells, keypoints], as ResNetEncoder's


@pytest.mark.parametrize("pooling", ["keypoints", "flatten"])
def test_flatten_pooling_keeps_what_the_cells_hold(pooling: str) -> None:
    """`model.image_pooling`. A spatial softmax sees only where each map peaks: maps raised
    by a constant give the same keypoints. Catches a `flatten` that still pools by the
    softmax (it would be as blind) or a `keypoints` that stopped being one (lerobot's)."""
    from embodichain_models.policies.diffusion.model import CameraEncoder

    torch.manual_seed(0)
    encoder = CameraEncoder(4, 3, 8, (64, 96), pooling)  # maps of 2x3 cells
    maps = torch.randn(1, 6, 3)
    outputs = []
    for shifted in (maps, maps + 2.0):
        encoder.backbone = FixedMaps(shifted)
        outputs.append(encoder(torch.zeros(1, 3, 64, 96)))
    assert outputs[0].shape == (1, 8)
    assert torch.allclose(outputs[0], outputs[1]) == (pooling == "keypoints")


def test_each_slot_keeps_its_own_history_and_a_reset_restarts_it() -> None:
    """R-DP-3. Catches a history shared by the slots, one not padded with the episode's
    first observation, or one that survives a slot's reset: after steps A, B and a reset
    of slot 1 at C, slot 0 sees [B, C] and slot 1 [C, C]."""
    from embodichain_models.policies.diffusion.acting import HistoryActing

    seen: list[dict[str, torch.Tensor]] = []

    def sample(histories: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        seen.append(histories)
        return torch.zeros(noise.shape)

    policy = HistoryActing(sample, ["observation.state", "observation.images.top"], 2, 4, 14,
                           {"horizon": 1})
    rng = np.random.default_rng(0)
    steps = [observation(rng, 2) for _ in range(3)]
    policy.reset(0)
    policy.reset(1)
    policy.act(steps[0])
    policy.act(steps[1])
    policy.reset(1)
    policy.act(steps[2])
    assert len(seen) == 6  # each step, a sample for each slot (alone: a batch of one)
    state = [np.float32(s["agent_pos"]) for s in steps]
    top = [s["pixels"]["top"] for s in steps]

    def history(call: int, key: str) -> np.ndarray:
        return seen[call][key].numpy()[0]

    assert np.array_equal(history(0, "observation.state"), np.stack([state[0][0]] * 2))
    assert np.array_equal(history(4, "observation.state"), np.stack([state[1][0], state[2][0]]))
    assert np.array_equal(history(5, "observation.state"), np.stack([state[2][1]] * 2))
    frames = history(4, "observation.images.top")
    assert frames.dtype == np.uint8 and np.array_equal(frames, np.stack([top[1][0], top[2][0]]))
    assert np.array_equal(history(5, "observation.images.top"), np.stack([top[2][1]] * 2))


def test_the_policy_draws_its_noise_by_the_runners_rule() -> None:
    """R-DP-3. Catches a policy whose noise is not the runner's (torch's generator, another
    keying), so that its exported artifact, whose noise the runner draws, would act
    otherwise: the k-th horizon of the episode of seed s in a slot is sampled from
    `runner.episode_noise(s, k, [horizon, action_dim])`, whichever slot, from 0 again after
    the slot's reset."""
    from embodichain_models.policies.diffusion.acting import HistoryActing

    from embodichain.core.deploy.runner import episode_noise

    drawn: list[np.ndarray] = []

    def sample(histories: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        drawn.append(noise.numpy()[0])
        return torch.zeros(noise.shape)

    policy = HistoryActing(sample, ["observation.state", "observation.images.top"], 2, 4, 14,
                           {"horizon": 2})
    obs = observation(np.random.default_rng(0), 2)
    for slot, seed in enumerate((11, 7)):
        policy.reset(slot)
        policy.seed_episode(slot, seed)
    for _ in range(4):
        policy.act(obs)
    policy.reset(0)
    policy.seed_episode(0, 11)
    policy.act(obs)
    keys = [(11, 0), (7, 0), (11, 1), (7, 1), (11, 0), (7, 2)]  # every 2 steps, slot 0, 1
    assert len(drawn) == len(keys)
    for noise, (seed, k) in zip(drawn, keys, strict=True):
        assert np.array_equal(noise, episode_noise(seed, k, (4, 14)))


def test_temporal_ensembling_samples_every_step_and_averages_as_act() -> None:
    """`model.temporal_ensemble`. Catches the option lost on the way to acting (a horizon
    every n_action_steps still) or ensembled otherwise than ACT's (the newest weighted most,
    a stale horizon kept): with the k-th sampled horizon holding k in every action, step t
    acts the exp(-m i)-weighted mean of the horizons sampled at t-7..t (horizon 8; i = 0 the
    oldest), each from its own noise; and the artifact's interface names that execution."""
    from embodichain_models.policies.diffusion.sl_recipe import make_policy

    model = tiny_policy(temporal_ensemble=0.5)
    assert model.interface()["execution"] == {"temporal_ensemble": 0.5}
    policy = make_policy(model, torch.device("cpu"))
    sampled: list[np.ndarray] = []

    def sample(histories: dict[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        sampled.append(noise.numpy())
        return torch.full(noise.shape, float(len(sampled) - 1))

    policy.sample_fn = sample
    policy.reset(0)
    policy.seed_episode(0, 5)
    obs = observation(np.random.default_rng(0), 1)
    for t in range(10):
        action = policy.act(obs)[0]
        ages = list(range(max(0, t - 7), t + 1))
        weights = np.exp(-0.5 * np.arange(len(ages)))
        assert np.allclose(action, np.dot(weights, ages) / weights.sum(), rtol=0, atol=1e-6)
    assert len(sampled) == 10 and not np.array_equal(sampled[0], sampled[1])


def test_ddim_with_a_fixed_generator_is_deterministic_and_follows_the_episode_seed() -> None:
    """R-DP-3. Catches noise from the global generator (a verdict then depends on what ran
    before), from the slot (on which slot or rank ran the episode) or drawn for every
    slot at every sample (on the other slots' steps): the same observations and episode seed
    give the same actions alone, in slot 1 of 2, and again; another seed other actions;
    and the sampler itself is deterministic given its noise."""
    from embodichain_models.policies.diffusion.sl_recipe import make_policy

    model = tiny_policy()
    obs = observation(np.random.default_rng(1), 2)
    noise = torch.randn(2, 8, 14, generator=torch.Generator().manual_seed(3))
    histories = {"observation.state": torch.from_numpy(np.float32(obs["agent_pos"]))[:, None]
                 .repeat(1, 2, 1),
                 "observation.images.top": torch.from_numpy(obs["pixels"]["top"])[:, None]
                 .repeat(1, 2, 1, 1, 1)}
    assert torch.equal(model.act_chunk(histories, noise), model.act_chunk(histories, noise))

    def actions(slot_seeds: list[int], steps: int = 5) -> np.ndarray:
        policy = make_policy(model, torch.device("cpu"))
        for slot, seed in enumerate(slot_seeds):
            policy.reset(slot)
            policy.seed_episode(slot, seed)
        torch.manual_seed(len(slot_seeds))  # the global generator must not matter
        return np.stack([policy.act(obs) for _ in range(steps)])

    pair = actions([11, 7])
    again = actions([11, 7])
    other = actions([12, 8])
    assert np.array_equal(pair, again)
    swapped = {"agent_pos": obs["agent_pos"][::-1].copy(),
               "pixels": {"top": obs["pixels"]["top"][::-1].copy()}}
    policy = make_policy(model, torch.device("cpu"))
    for slot, seed in enumerate([7, 11]):
        policy.reset(slot)
        policy.seed_episode(slot, seed)
    assert np.array_equal(np.stack([policy.act(swapped) for _ in range(5)])[:, 0], pair[:, 1])
    assert not np.allclose(pair[:, 1], other[:, 1])
    alone = make_policy(model, torch.device("cpu"))
    alone.reset(0)
    alone.seed_episode(0, 7)
    single = np.stack([alone.act({"agent_pos": obs["agent_pos"][1:],
                                  "pixels": {"top": obs["pixels"]["top"][1:]}})
                       for _ in range(5)])
    assert np.array_equal(single[:, 0], pair[:, 1])


def test_the_insertion_recipe_is_the_transfer_cube_recipe_on_other_data() -> None:
    """Catches the two diffusion recipes drifting apart (one retuned, the other not): the
    insertion recipe differs only in its task, data, environment and output directory."""
    import yaml

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    cube = flat(yaml.safe_load(DIFFUSION_EXAMPLE.read_text()))
    insertion = flat(yaml.safe_load(DIFFUSION_EXAMPLE.with_name("insertion_diffusion.yaml")
                                    .read_text()))
    differing = {key for key in cube.keys() | insertion.keys()
                 if cube.get(key) != insertion.get(key)}
    assert differing == {"data.root", "data.task", "evaluation.env.id",
                         "evaluation.env.kwargs.task", "trainer.output_dir"}
    assert insertion["data.task"] == insertion["evaluation.env.kwargs.task"] == "insertion"


def test_init_writes_the_example_recipe(tmp_path: Path) -> None:
    """Catches the packaged copy (`embodichain init aloha_diffusion`, which docs/diffusion.md
    calls the same recipe) left behind when the example is retuned: it once kept epsilon
    prediction, keypoints and lr 1e-4 after the example had moved on."""
    import yaml

    from tests.support.cli import invoke

    assert invoke("init", "aloha_diffusion", str(tmp_path / "r.yaml")).exit_code == 0
    written = yaml.safe_load((tmp_path / "r.yaml").read_text())
    assert written == yaml.safe_load(DIFFUSION_EXAMPLE.read_text())
