"""augmenting.py's dataset (torch, `random` and NumPy jitter in `__getitem__`), each example
carrying its corpus `index`, with a model WITHOUT dropout (so runs on different world sizes
can be compared: nothing per-rank is random), recording every micro-batch the objective
sees as a JSON line `{"step", "rank", "index", "x"}` in `$RECORD_DIR/rank<RANK>.jsonl`
(appended; a test gives each run its own directory).

EMBODICHAIN_TEST_SOURCE=tensor: the corpus in memory instead (no augmentation, no index).

Named in recipes as `global_recording:build_supervised_trainer` with tests/factories on
PYTHONPATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from augmenting import AugmentingDataset
from torch import nn

from embodichain.learning.sl import DatasetSource, SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


class IndexedDataset(AugmentingDataset):
    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {**super().__getitem__(index), "index": torch.tensor(index)}


def build_supervised_trainer(config, device):
    corpus = sl_ddp.make_corpus(config.data.train_size, config.data.seed)
    identity = TensorSource(corpus).identity
    source = (TensorSource(corpus) if os.environ.get("EMBODICHAIN_TEST_SOURCE") == "tensor"
              else DatasetSource(IndexedDataset(corpus, True, None), identity=identity))
    validation = sl_ddp.make_corpus(config.data.val_size, sl_ddp.validation_seed(config.data.seed))
    model = nn.Sequential(nn.Linear(4, config.model.hidden), nn.Tanh(),
                          nn.Linear(config.model.hidden, 2))
    rank = int(os.environ.get("RANK", "0"))
    record = Path(os.environ["RECORD_DIR"]) / f"rank{rank}.jsonl"
    trainer: SupervisedTrainer

    def objective(model, batch):
        with record.open("a") as f:
            f.write(json.dumps({"step": trainer.step + 1, "rank": rank,
                                "index": batch["index"].tolist() if "index" in batch else None,
                                "x": batch["x"].tolist()}) + "\n")
        return sl_ddp.masked_mse(model, batch)

    def evaluate(model, device):
        return {"validation/mse": sl_ddp.masked_mse(model, validation).loss.item()}

    trainer = SupervisedTrainer(config, model=model, source=source, objective=objective,
                                device=device, evaluate=evaluate)
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
