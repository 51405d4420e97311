"""Factory of the cart-pole behaviour-cloning recipe (entry point `cartpole_bc`).

The training source is the LeRobot dataset's episodes but the last `data.val_episodes`
(or a weighted mixture of datasets, `data.mixture`, each part holding out its last ones):
each example holds the last `data.frames` camera frames (video, decoded by the DataLoader
workers), the state, and the chunk of the next `data.chunk` forces normalised with
`meta/stats.json`, with `action_is_pad` past the episode's end. Validation: on rank 0 the
held-out episodes' action error (a mixture's also part by part,
`validation/<name>/action_mse`) and the expert's success rate from the evaluation's starts;
on every rank the policy in closed loop in the simulated cart-pole, through the recipe's
`evaluation` section (`embodichain_models/CartPoleSwingUp-v0`; its success rate is the best
metric, higher is better). The dataset's statistics and camera size are the model's facts:
recorded in its checkpoints, so `eval` and `export` rebuild it with the data gone.
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, UsageError, facts_from_checkpoint
from embodichain_models.data.lerobot import LeRobotFormatError
from embodichain_models.policies.cartpole_bc.data import bc_data
from embodichain_models.policies.cartpole_bc.policy import ChunkExecution, ChunkPolicy, objective
from embodichain_models.policies.cartpole_bc.rollout import expert_success_rate
from embodichain_models.policies.cartpole_bc.schema import BcConfig


def build_supervised_trainer(config: BcConfig, device: torch.device) -> SupervisedTrainer:
    data = config.data
    facts, bc = facts_from_checkpoint(), None  # rebuilt to act: the data is not read
    if facts is None:
        try:
            bc = bc_data(config)
        except (LeRobotFormatError, ImportError) as exc:
            raise UsageError(str(exc)) from None
        facts = {"stats": {key: {k: bc.stats[key][k] for k in ("mean", "std")}
                           for key in ("observation.state", "action")}, "size": bc.size}
    stats, size = facts["stats"], int(facts["size"])
    state_std = torch.tensor(stats["observation.state"]["std"], dtype=torch.float32)
    v, closed_loop = config.validation, config.evaluation
    model = ChunkPolicy(data.frames, size, data.chunk, config.model.channels,
                        config.model.hidden, state_std[[0, 2, 3]].clamp_min(1e-3),
                        torch.tensor(stats["action"]["mean"]), torch.tensor(stats["action"]["std"]),
                        execute=min(v.execute, data.chunk))
    camera = (closed_loop.env.kwargs.get("size", 64) if closed_loop is not None else size)
    if camera != size:
        raise UsageError(f"evaluation.env.kwargs.size is {camera}, but the dataset's camera "
                         f"frames are {size}x{size}: set evaluation.env.kwargs.size: {size}")
    expert: list[float] = []
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def held_out(name: str) -> dict[str, torch.Tensor]:
        assert bc is not None
        if name not in cache:  # read once, on rank 0
            examples = bc.held_out[name]
            stride = max(1, len(examples) // v.max_examples)
            cache[name] = torch.utils.data.default_collate(
                [examples[i] for i in range(0, len(examples), stride)][:v.max_examples])
        return {k: t.to(device) for k, t in cache[name].items()}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        assert bc is not None
        core = getattr(model, "module", model)
        batches = {name: held_out(name) for name in bc.held_out}
        if "" in batches:  # one dataset
            metrics = {"validation/action_mse": objective(core, batches[""]).loss.item()}
        else:  # a mixture: part by part, and over all parts' examples
            metrics = {f"validation/{name}/action_mse": objective(core, b).loss.item()
                       for name, b in batches.items()}
            every = {k: torch.cat([b[k] for b in batches.values()]) for k in
                     next(iter(batches.values()))}
            metrics["validation/action_mse"] = objective(core, every).loss.item()
        if closed_loop is not None:  # the expert from the evaluation's starts, once
            if not expert:
                expert.append(expert_success_rate(closed_loop.episodes, closed_loop.seed,
                                                  closed_loop.max_steps))
            metrics["validation/expert_success_rate"] = expert[0]
        return metrics

    def make_policy(model: nn.Module, device: torch.device) -> ChunkExecution:
        return ChunkExecution(model, device, data.frames, v.execute)

    return SupervisedTrainer(config, model=model, source=bc.source if bc else None,
                             objective=objective, device=device,
                             evaluate=evaluate if bc is not None else None, policy=make_policy,
                             best=("validation/success_rate", "max"), model_facts=facts)


build_supervised_trainer.config_schema = BcConfig
