"""sl_ddp's corpus as a `DatasetSource` that augments every example with torch, `random` and
NumPy, and a model with dropout (so the training process's own stream matters too).

Named in recipes as `augmenting:build_supervised_trainer` with tests/factories on PYTHONPATH.

- EMBODICHAIN_TEST_SOURCE=tensor: the same corpus as an in-memory TensorSource, and
  EMBODICHAIN_TEST_AUGMENT=0 turns the augmentation off (for the equivalence of the two).
- EMBODICHAIN_TEST_FAIL_INDEX=I: `__getitem__` raises at example I.
- EMBODICHAIN_TEST_HANG_INDEX=I: `__getitem__` hangs (sleeps an hour) at example I.
- EMBODICHAIN_TEST_SLEEP_S: seconds to sleep in every update (time to kill something).
- EMBODICHAIN_TEST_SLOW_RANK=R:S: `__getitem__` sleeps S seconds per example on rank R only
  (a rank whose data is slow).
- EMBODICHAIN_TEST_KILLS / EMBODICHAIN_TEST_KILL_LOG: SIGKILL a training worker while it
  computes an update, once per kill id, as in restarting.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import numpy
import torch
from torch import nn

from embodichain.learning.sl import DatasetSource, SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


class AugmentingDataset:
    """Examples of an in-memory corpus, jittered by all three global generators."""

    def __init__(self, tensors: dict[str, torch.Tensor], augment: bool, fail_index: int | None
                 ) -> None:
        self.tensors, self.augment, self.fail_index = tensors, augment, fail_index
        slow_rank, _, seconds = os.environ.get("EMBODICHAIN_TEST_SLOW_RANK", "").partition(":")
        self.slow_s = float(seconds) if slow_rank == os.environ.get("RANK", "0") else 0.0

    def __len__(self) -> int:
        return len(self.tensors["x"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index == self.fail_index:
            raise ValueError(f"corrupt record {index} (test)")
        if str(index) == os.environ.get("EMBODICHAIN_TEST_HANG_INDEX"):
            time.sleep(3600)  # a read that never returns (a dead NFS mount, a lock)
        if self.slow_s:
            time.sleep(self.slow_s)
        example = {k: v[index] for k, v in self.tensors.items()}
        if self.augment:
            jitter = (0.05 * torch.randn(4) + 0.05 * random.gauss(0.0, 1.0)
                      + torch.from_numpy(0.05 * numpy.random.randn(4)).float())
            example["x"] = example["x"] + jitter
        return example


def _kill_pending(rank: int, step: int) -> str | None:
    log = Path(os.environ["EMBODICHAIN_TEST_KILL_LOG"])
    done = set(log.read_text().split()) if log.exists() else set()
    for kill in json.loads(os.environ["EMBODICHAIN_TEST_KILLS"]):
        if kill["rank"] == rank and kill["update"] == step and kill["id"] not in done:
            with log.open("a") as f:
                f.write(f"{kill['id']}\n")
            return kill["id"]
    return None


def build_supervised_trainer(config, device):
    corpus = sl_ddp.make_corpus(config.data.train_size, config.data.seed)
    if os.environ.get("EMBODICHAIN_TEST_SOURCE") == "tensor":
        source = TensorSource(corpus)
    else:
        fail = os.environ.get("EMBODICHAIN_TEST_FAIL_INDEX")
        dataset = AugmentingDataset(corpus, os.environ.get("EMBODICHAIN_TEST_AUGMENT") != "0",
                                    int(fail) if fail else None)
        source = DatasetSource(dataset, identity=TensorSource(corpus).identity)
    validation = sl_ddp.make_corpus(config.data.val_size, sl_ddp.validation_seed(config.data.seed))
    model = nn.Sequential(nn.Linear(4, config.model.hidden), nn.Tanh(), nn.Dropout(0.1),
                          nn.Linear(config.model.hidden, 2))
    rank = int(os.environ.get("RANK", "0"))
    pause = float(os.environ.get("EMBODICHAIN_TEST_SLEEP_S", "0"))
    trainer: SupervisedTrainer

    def objective(model, batch):
        if pause:
            time.sleep(pause)
        if "EMBODICHAIN_TEST_KILLS" in os.environ and _kill_pending(rank, trainer.step + 1):
            os.kill(os.getpid(), signal.SIGKILL)
        return sl_ddp.masked_mse(model, batch)

    def evaluate(model, device):
        return {"validation/mse": sl_ddp.masked_mse(model, validation).loss.item()}

    trainer = SupervisedTrainer(config, model=model, source=source, objective=objective,
                                device=device, evaluate=evaluate)
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
