"""A recipe over a LeRobot dataset on disk (`data.root`: `observation.state` [3] and `action`
[2] per frame, no camera), a linear policy from state to action: the smallest run whose
data is files, so that a changed file changes the run's data identity and its history.

Named in recipes as `file_backed:build_supervised_trainer` with tests/factories on
PYTHONPATH; the framework's sections are the CPU example's."""

from __future__ import annotations

import torch
from embodichain_models.data.lerobot import lerobot_source
from pydantic import BaseModel, ConfigDict
from torch import nn

from embodichain.learning.sl import LossResult, Section, SupervisedTrainer


class DataConfig(Section):
    root: str


class FileBackedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    data: DataConfig


def build_supervised_trainer(config, device):
    source = lerobot_source(config.data.root)
    model = nn.Linear(3, 2)

    def objective(model, batch):
        target = batch["action"]
        loss = (model(batch["observation.state"]) - target).square().mean()
        return LossResult(loss=loss, weight=torch.tensor(float(len(target))), metrics={})

    return SupervisedTrainer(config, model=model, source=source, objective=objective,
                             device=device)


build_supervised_trainer.config_schema = FileBackedConfig
