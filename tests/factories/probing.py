"""sl_ddp's corpus as a `DatasetSource` whose examples take a known, rank-dependent time to
load, with probes of where validation runs and what each rank measured of its data wait.

Named in recipes as `probing:build_supervised_trainer` with tests/factories on PYTHONPATH;
RECORD_DIR is required (the build fails without it, so a test cannot read a stale record).

- `__getitem__` sleeps PROBE_SLEEP_S x (1 + 2 x rank) seconds per example (default 0): rank
  1's data is three times as slow as rank 0's.
- Each update appends `{"step", "rank", "own", "waits"}` to `$RECORD_DIR/waits.rank<R>.jsonl`:
  `own` is the data wait this rank measured and handed to the learner (read when the learner
  asks for it), `waits` the per-rank waits the update's all-reduce brought back.
- `evaluate` and a validation callback each create `$RECORD_DIR/<evaluate|callback>.rank<R>
  .step<S>` when they run: which ranks validate.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from embodichain.learning.sl import DatasetSource, SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


class SlowDataset:
    def __init__(self, tensors: dict[str, torch.Tensor], seconds: float) -> None:
        self.tensors, self.seconds = tensors, seconds

    def __len__(self) -> int:
        return len(self.tensors["x"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.seconds:
            time.sleep(self.seconds)
        return {k: v[index] for k, v in self.tensors.items()}


class RankProbe:
    """A validation callback that leaves a file per call, named by rank and update."""

    def __init__(self, directory: Path, rank: int) -> None:
        self.directory, self.rank = directory, rank

    def on_validation(self, trainer, metrics: dict[str, float]) -> None:
        (self.directory / f"callback.rank{self.rank}.step{trainer.step}").touch()


def build_supervised_trainer(config, device):
    records = Path(os.environ["RECORD_DIR"])
    rank = int(os.environ.get("RANK", "0"))
    corpus = sl_ddp.make_corpus(config.data.train_size, config.data.seed)
    seconds = float(os.environ.get("PROBE_SLEEP_S", "0")) * (1 + 2 * rank)
    source = DatasetSource(SlowDataset(corpus, seconds), identity=TensorSource(corpus).identity)
    validation = sl_ddp.make_corpus(config.data.val_size,
                                    sl_ddp.validation_seed(config.data.seed))

    def evaluate(model, device):
        (records / f"evaluate.rank{rank}.step{trainer.step}").touch()
        return {"validation/mse": sl_ddp.masked_mse(model, validation).loss.item()}

    trainer = SupervisedTrainer(config, model=sl_ddp.make_model(config.model.hidden),
                                source=source, objective=sl_ddp.masked_mse, device=device,
                                evaluate=evaluate, callbacks=[RankProbe(records, rank)])
    update = trainer.learner.update
    log = records / f"waits.rank{rank}.jsonl"

    def recorded(objective, batches, *, data_wait=0.0, **kwargs):
        measured: list[float] = []

        def wait() -> float:
            measured.append(data_wait())
            return measured[-1]

        if not callable(data_wait):  # a wait measured before the update: recorded as is
            measured.append(data_wait)
        result = update(objective, batches, data_wait=wait if callable(data_wait)
                        else data_wait, **kwargs)
        with log.open("a") as f:
            f.write(json.dumps({"step": trainer.step + 1, "rank": rank, "own": measured[-1],
                                "waits": list(result.data_waits)}) + "\n")
        return result

    trainer.learner.update = recorded
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
