"""Factory of the ALOHA ACT recipe (entry point `aloha_act`, R-ALOHA-1).

The source is the LeRobot dataset's frames (all episodes, or all but the last
`data.val_episodes`): each example holds the current joint positions, object poses (and
camera images when `data.cameras` names some) and the chunk of the next `data.chunk`
joint targets, with `action_is_pad` past the episode's end. The model is an ACT
(`model.py`); the recipe's `evaluation:` section judges it in gym-aloha's scene, its
chunks executed by `execution` (temporal ensembling or a fixed horizon), at every
validation: `validation/success_rate` is the best metric, higher is better. With held-out
episodes validation also reports their action error (`validation/action_l1`).
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, UsageError
from embodichain_models.data.lerobot import LeRobotFormatError
from embodichain_models.policies.aloha.data import act_data, check_evaluation
from embodichain_models.policies.aloha.execution import ChunkExecution
from embodichain_models.policies.aloha.model import (
    ACTION,
    ActPolicy,
    ActShape,
    masked_l1,
    normalised_actions,
    objective,
)
from embodichain_models.policies.aloha.scene import require_sim
from embodichain_models.policies.aloha.schema import ActConfig
from embodichain_models.policies.aloha.tasks import JOINT_NAMES, TASKS

MAX_HELD_OUT = 512  # held-out frames whose action error is validated (evenly spaced)


def make_model(config: ActConfig, env_dim: int, stats: dict, fps: int,
               image_sizes: dict[str, tuple[int, int]]) -> ActPolicy:
    m, e = config.model, config.execution
    execution = ({"temporal_ensemble": e.temporal_ensemble} if e.temporal_ensemble is not None
                 else {"horizon": e.horizon})
    shape = ActShape(len(JOINT_NAMES), env_dim, len(JOINT_NAMES), config.data.chunk,
                     tuple(config.data.cameras), m.hidden, m.heads, m.encoder_layers,
                     m.decoder_layers, m.feedforward, m.dropout, m.cvae, m.latent_dim,
                     m.kl_weight, m.channels, fps, execution,
                     tuple(image_sizes[c] for c in config.data.cameras))
    return ActPolicy(shape, stats)


def policy_factory(execution: dict[str, float]):
    """`make_policy(model, device)`: the model's chunks executed as the recipe says."""

    def make_policy(model: nn.Module, device: torch.device) -> ChunkExecution:
        core: ActPolicy = getattr(model, "module", model).acting_copy()
        return ChunkExecution(core.act_chunk, core.observation_keys(), core.shape.chunk,
                              device, **execution)

    return make_policy


def build_supervised_trainer(config: ActConfig, device: torch.device) -> SupervisedTrainer:
    require_sim()  # the evaluation runs gym-aloha: say so before anything is read
    task = TASKS[config.data.task]
    check_evaluation(config, task)
    try:
        data = act_data(config)
    except (LeRobotFormatError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    model = make_model(config, data.env_dim, data.stats, data.fps, data.image_sizes)
    cache: dict[str, torch.Tensor] = {}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
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

    return SupervisedTrainer(config, model=model, source=data.source, objective=objective,
                             device=device,
                             evaluate=evaluate if data.held_out is not None else None,
                             policy=policy_factory(model.shape.execution),
                             best=("validation/success_rate", "max"))


build_supervised_trainer.config_schema = ActConfig
