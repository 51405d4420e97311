"""Factory of the cart-pole behaviour-cloning recipe (entry point `cartpole_bc`).

The training source is the LeRobot dataset's episodes but the last `data.val_episodes`:
each example holds the last `data.frames` camera frames (video, decoded by the DataLoader
workers), the state, and the chunk of the next `data.chunk` forces normalised with
`meta/stats.json`, with `action_is_pad` past the episode's end. Validation on rank 0: the
held-out episodes' action error and the closed-loop success rate in the simulator (the
best metric, higher is better).
"""

from __future__ import annotations

import torch
from torch import nn

from embodichain.learning.sl import SupervisedTrainer, UsageError
from embodichain_models.data.lerobot import LeRobotFormatError, lerobot_source
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.data.lerobot.metadata import read_meta
from embodichain_models.policies.cartpole_bc.policy import ChunkPolicy, objective
from embodichain_models.policies.cartpole_bc.prepare import IMAGE_KEY
from embodichain_models.policies.cartpole_bc.rollout import ClosedLoop
from embodichain_models.policies.cartpole_bc.schema import BcConfig

USED_FEATURES = (IMAGE_KEY, "observation.state", "action")


def dataset_options(config: BcConfig, fps: int) -> dict:
    data = config.data
    return {"delta_timestamps": {IMAGE_KEY: [(i - data.frames + 1) / fps
                                             for i in range(data.frames)],
                                 "action": [i / fps for i in range(data.chunk)]},
            "normalize": {"action": "mean_std"}, "tolerance_s": data.tolerance_s,
            # What the policy reads: other cameras of a dataset are neither read nor checked.
            "features": list(USED_FEATURES)}


def build_supervised_trainer(config: BcConfig, device: torch.device) -> SupervisedTrainer:
    data = config.data
    try:
        meta = read_meta(data.root)
        indices = [e.index for e in meta.episodes]
        if len(indices) <= data.val_episodes:
            raise UsageError(f"{data.root} has {len(indices)} episodes: too few to hold out "
                             f"data.val_episodes={data.val_episodes} and train on the rest")
        options = dataset_options(config, meta.fps)
        source = lerobot_source(data.root, episodes=indices[:-data.val_episodes],
                                identity=data.identity, **options)
        held_out = LeRobotFrames(data.root, episodes=indices[-data.val_episodes:], **options)
    except (LeRobotFormatError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    stats = meta.stats
    size = int(meta.features[IMAGE_KEY]["shape"][0])
    state_std = torch.tensor(stats["observation.state"]["std"], dtype=torch.float32)
    model = ChunkPolicy(data.frames, size, data.chunk, config.model.channels,
                        config.model.hidden, state_std[[0, 2, 3]].clamp_min(1e-3),
                        torch.tensor(stats["action"]["mean"]), torch.tensor(stats["action"]["std"]))
    v = config.validation
    closed_loop = ClosedLoop(v.episodes, v.steps, v.seed, data.frames, size, v.execute)
    cache: dict[str, dict[str, torch.Tensor]] = {}

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        if "val" not in cache:  # read once, on rank 0
            stride = max(1, len(held_out) // v.max_examples)
            examples = [held_out[i] for i in range(0, len(held_out), stride)][:v.max_examples]
            cache["val"] = torch.utils.data.default_collate(examples)
        batch = {k: t.to(device) for k, t in cache["val"].items()}
        core = getattr(model, "module", model)
        metrics = {"validation/action_mse": objective(core, batch).loss.item()}
        metrics.update(closed_loop(core, device))
        return metrics

    return SupervisedTrainer(config, model=model, source=source, objective=objective,
                             device=device, evaluate=evaluate,
                             best=("validation/success_rate", "max"))


build_supervised_trainer.config_schema = BcConfig
