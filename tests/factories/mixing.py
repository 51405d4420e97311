"""A 3:1 mixture of the two datasets of tests/models/lerobot/helpers.py `mixture_parts` (in
`$MIXTURE_DIR/a` and `/b`, B renamed), a linear policy from state to the action window,
recording every micro-batch its objective sees as a JSON line `{"step", "rank", "part",
"episode", "frame"}` in `$RECORD_DIR/rank<RANK>.jsonl` (when RECORD_DIR is set).

Named in recipes as `mixing:build_supervised_trainer` with tests/factories on PYTHONPATH; the
recipe is the CPU example's (its data section is not used). EMBODICHAIN_TEST_KILLS /
EMBODICHAIN_TEST_KILL_LOG: SIGKILL a training worker in an update, as in augmenting.py."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import torch
from augmenting import _kill_pending
from embodichain_models.data.lerobot import lerobot_mixture, lerobot_source
from torch import nn

from embodichain.learning.sl import LossResult, SupervisedTrainer
from embodichain.plugins import sl_ddp

RENAME = {"state": "observation.state", "act": "action", "cam": "observation.images.top"}
OPTIONS = {"delta_timestamps": {"action": [0.0, 2 / 30]}, "normalize": {"action": "mean_std"}}


def build_supervised_trainer(config, device):
    root = Path(os.environ["MIXTURE_DIR"])
    b = lerobot_source(root / "b", rename=RENAME, **OPTIONS)
    source = lerobot_mixture([(root / "a", 3), (b, 1)], names=["a", "b"], **OPTIONS)
    model = nn.Linear(3, 4)
    rank = int(os.environ.get("RANK", "0"))
    record = Path(os.environ["RECORD_DIR"]) / f"rank{rank}.jsonl" \
        if "RECORD_DIR" in os.environ else None
    trainer: SupervisedTrainer

    def objective(model, batch):
        if "EMBODICHAIN_TEST_KILLS" in os.environ and _kill_pending(rank, trainer.step + 1):
            os.kill(os.getpid(), signal.SIGKILL)
        if record is not None:
            with record.open("a") as f:
                f.write(json.dumps({"step": trainer.step + 1, "rank": rank,
                                    "part": batch["part_index"].tolist(),
                                    "episode": batch["episode_index"].tolist(),
                                    "frame": batch["frame_index"].tolist()}) + "\n")
        pred = model(batch["observation.state"] * batch["observation.images.top"].mean())
        target = batch["action"].flatten(1)
        loss = (pred - target).square().mean()
        return LossResult(loss=loss, weight=torch.tensor(float(len(target))), metrics={})

    trainer = SupervisedTrainer(config, model=model, source=source, objective=objective,
                                device=device)
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
