"""Factory of the ALOHA ACT recipe (entry point `aloha_act`, R-ALOHA-1).

The source is the LeRobot dataset's frames (all episodes, or all but the last
`data.val_episodes`): each example holds the current joint positions and object poses
(privileged state), or, when `data.cameras` names some, the joint positions and those
cameras' images only (gym-aloha's `pixels_agent_pos`), and the chunk of the next
`data.chunk` joint targets, with `action_is_pad` past the episode's end. The model is an ACT
(`model.py`); the recipe's `evaluation:` section judges it in gym-aloha's scene, its
chunks executed by `execution` (temporal ensembling or a fixed horizon), at every
validation: `validation/strict_success_rate` (the strict verdict, R-TRUST-1: a policy that
touches the cube and drops it is not the best) is the best metric, higher is better,
reported beside `validation/success_rate` (the field's) and both at step 300 (`judge.py`,
R-ALOHA-2). The validation seeds select; reported figures come from `embodichain eval` on
the recipe's `evaluation.test_seed` (R-TRUST-2). With held-out
episodes validation also reports their action error (`validation/action_l1`).
What the model is built from of the dataset (statistics, fps, sizes) is recorded in its
checkpoints, so `eval` and `export` rebuild it with the data gone (and `export` without the
simulator).
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer
from embodichain_models.envs.aloha.judge import AlohaJudge
from embodichain_models.envs.aloha.scene import require_sim
from embodichain_models.envs.aloha.tasks import CAMERA_FRAME, JOINT_NAMES, TASKS
from embodichain_models.policies.act.data import check_evaluation, dataset_facts
from embodichain_models.policies.act.execution import ChunkExecution
from embodichain_models.policies.act.model import (
    ACTION,
    ActPolicy,
    ActShape,
    masked_l1,
    normalised_actions,
    objective,
)
from embodichain_models.policies.act.schema import ActConfig

MAX_HELD_OUT = 512  # held-out frames whose action error is validated (evenly spaced)


def make_model(config: ActConfig, env_dim: int, stats: dict, fps: int,
               image_sizes: dict[str, tuple[int, int]]) -> ActPolicy:
    m, e = config.model, config.execution
    execution = ({"temporal_ensemble": e.temporal_ensemble} if e.temporal_ensemble is not None
                 else {"horizon": e.horizon})
    cameras = tuple(config.data.cameras)
    shape = ActShape(len(JOINT_NAMES), 0 if cameras else env_dim, len(JOINT_NAMES),
                     config.data.chunk, cameras, m.hidden, m.heads, m.encoder_layers,
                     m.decoder_layers, m.feedforward, m.dropout, m.cvae, m.latent_dim,
                     m.kl_weight, m.channels, fps, execution,
                     tuple(image_sizes[c] for c in cameras), CAMERA_FRAME, m.image_shift)
    return ActPolicy(shape, stats)


def policy_factory(execution: dict[str, float]):
    """`make_policy(model, device)`: the model's chunks executed as the recipe says."""

    def make_policy(model: nn.Module, device: torch.device) -> ChunkExecution:
        core: ActPolicy = getattr(model, "module", model).acting_copy()
        return ChunkExecution(core.act_chunk, core.observation_keys(), core.shape.chunk,
                              device, **execution)

    return make_policy


def build_supervised_trainer(config: ActConfig, device: torch.device) -> SupervisedTrainer:
    if getattr(config, "evaluation", None) is not None:
        require_sim()  # the evaluation runs gym-aloha: say so before anything is read
    task = TASKS[config.data.task]
    check_evaluation(config, task)
    facts, data = dataset_facts(config, ("mean", "std"))  # ACT standardises
    model = make_model(config, int(facts["env_dim"]), facts["stats"], int(facts["fps"]),
                       {c: tuple(s) for c, s in facts["image_sizes"].items()})
    cache: dict[str, torch.Tensor] = {}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        assert data is not None and data.held_out is not None
        if not cache:  # read once, on rank 0
            frames = data.held_out
            stride = max(1, len(frames) // MAX_HELD_OUT)
            cache.update(torch.utils.data.default_collate(
                [frames[i] for i in range(0, len(frames), stride)][:MAX_HELD_OUT]))
        batch = {k: t.to(device) for k, t in cache.items()}
        core: ActPolicy = getattr(model, "module", model)
        l1, _ = masked_l1(core(batch)[0], normalised_actions(core, batch[ACTION]),
                          batch["action_is_pad"])  # the latent at its prior's mean, as acting
        return {"validation/action_l1": l1.item()}

    return SupervisedTrainer(config, model=model, source=data.source if data else None,
                             objective=objective, device=device,
                             evaluate=evaluate if data and data.held_out is not None else None,
                             policy=policy_factory(model.shape.execution), judge=AlohaJudge,
                             best=("validation/strict_success_rate", "max"), model_facts=facts,
                             demonstration_seeds=data.seeds if data else ())


build_supervised_trainer.config_schema = ActConfig
