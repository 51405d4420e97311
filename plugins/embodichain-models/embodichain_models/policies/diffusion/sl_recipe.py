"""Factory of the ALOHA Diffusion Policy recipe (entry point `aloha_diffusion`, R-DP-1).

The source is ACT's (`policies/act/data.py`): the LeRobot dataset's frames, each example
holding the observations of its frame and the `n_obs_steps`-1 before it (joint positions,
and the cameras' frames decoded in the data workers, or the objects' poses for a state
policy; R-DP-2) and the horizon of the next `horizon` actions (past the episode's end the
last action repeated). The model is a Diffusion Policy (`model.py`) trained to predict DDPM
noise; the recipe's `evaluation:` section judges it in gym-aloha's scene with ACT's judge,
acting through `acting.py` (DDIM samples every `n_action_steps` steps, or every step
ensembled, noise from each
episode's seed; R-DP-3), usually with the EMA's weights (`trainer.ema`, `evaluation.acting:
ema`). With held-out episodes validation also reports their noise-prediction error at fixed
noise (`validation/noise_mse`, or `validation/sample_mse` when the model predicts the
clean sample). What the model is built from of the dataset is recorded in
its checkpoints, so `eval` and `export` rebuild it with the data gone.
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer
from embodichain_models.envs.aloha.judge import AlohaJudge
from embodichain_models.envs.aloha.scene import require_sim
from embodichain_models.envs.aloha.tasks import CAMERA_FRAME, JOINT_NAMES, TASKS
from embodichain_models.policies.act.data import check_evaluation, dataset_facts
from embodichain_models.policies.act.model import ACTION
from embodichain_models.policies.diffusion.acting import HistoryActing
from embodichain_models.policies.diffusion.model import (
    DiffusionPolicy,
    DiffusionShape,
    execution_of,
    objective,
)
from embodichain_models.policies.diffusion.schema import DiffusionConfig

MAX_HELD_OUT = 512  # held-out frames whose noise-prediction error is validated


def make_model(config: DiffusionConfig, env_dim: int, stats: dict, fps: int,
               image_sizes: dict[str, tuple[int, int]]) -> DiffusionPolicy:
    m = config.model
    cameras = tuple(config.data.cameras)
    shape = DiffusionShape(
        len(JOINT_NAMES), 0 if cameras else env_dim, len(JOINT_NAMES), cameras,
        tuple(image_sizes[c] for c in cameras), CAMERA_FRAME, fps, m.horizon, m.n_obs_steps,
        m.n_action_steps, tuple(m.down_dims), m.kernel_size, m.groups, m.step_embedding,
        m.film_scale, m.channels, m.keypoints, m.image_features, m.image_shift,
        m.train_timesteps, m.sampling_steps, m.clip_sample, m.prediction, m.state_noise,
        m.image_pooling, m.state_dropout, m.temporal_ensemble)
    return DiffusionPolicy(shape, stats)


def make_policy(model: nn.Module, device: torch.device) -> HistoryActing:
    """The acting weights (the EMA's, as `evaluation.acting` says) sampling in closed loop."""
    core: DiffusionPolicy = getattr(model, "module", model).acting_copy()
    s = core.shape
    return HistoryActing(core.act_chunk, core.observation_keys(), s.n_obs_steps, s.horizon,
                         s.action_dim, execution_of(s), device)


def build_supervised_trainer(config: DiffusionConfig, device: torch.device
                             ) -> SupervisedTrainer:
    if getattr(config, "evaluation", None) is not None:
        require_sim()  # the evaluation runs gym-aloha: say so before anything is read
    check_evaluation(config, TASKS[config.data.task])
    facts, data = dataset_facts(config, ("min", "max"),  # scaled to [-1, 1], as lerobot's
                                chunk=config.model.horizon, history=config.model.n_obs_steps)
    model = make_model(config, int(facts["env_dim"]), facts["stats"], int(facts["fps"]),
                       {c: tuple(s) for c, s in facts["image_sizes"].items()})
    cache: dict[str, torch.Tensor] = {}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        assert data is not None and data.held_out is not None
        core: DiffusionPolicy = getattr(model, "module", model)
        if not cache:  # read once, on rank 0, with its noise and levels fixed
            frames = data.held_out
            stride = max(1, len(frames) // MAX_HELD_OUT)
            cache.update(torch.utils.data.default_collate(
                [frames[i] for i in range(0, len(frames), stride)][:MAX_HELD_OUT]))
            generator = torch.Generator().manual_seed(0)
            size = cache[ACTION].shape
            cache["noise"] = torch.randn(size, generator=generator)
            cache["level"] = torch.randint(0, core.shape.train_timesteps, size[:1],
                                           generator=generator)
        batch = {k: t.to(device) for k, t in cache.items()}
        actions = core.normalised_actions(batch[ACTION])
        noisy = core.schedule.add_noise(actions, batch["noise"], batch["level"])
        error = torch.nn.functional.mse_loss(core(batch, noisy, batch["level"]),
                                             core.target(actions, batch["noise"]))
        name = "sample_mse" if core.shape.prediction == "sample" else "noise_mse"
        return {f"validation/{name}": error.item()}

    return SupervisedTrainer(config, model=model, source=data.source if data else None,
                             objective=objective, device=device,
                             evaluate=evaluate if data and data.held_out is not None else None,
                             policy=make_policy, judge=AlohaJudge,
                             best=("validation/strict_success_rate", "max"), model_facts=facts,
                             demonstration_seeds=data.seeds if data else ())


build_supervised_trainer.config_schema = DiffusionConfig
