"""Recipe factories for the recovery tests, named in recipes as `recovery_factories:NAME`
(the tests put this directory on PYTHONPATH). Each one is the `sl_ddp` recipe (same corpus,
model and schema) plus one behaviour under test:

- `per_rank_draws`: the objective draws torch, Python and NumPy random numbers on every rank,
  and extra ones on rank 1, and appends them to `$RECOVERY_DRAWS_DIR/rank{R}.jsonl`; the model
  carries a buffer that each rank updates with its own batches (per-rank buffers, R-CKPT-5).
- `save_in_validation`: a validation callback on rank 0 calls `trainer.save(...)` (R-VAL-2),
  writing `during_validation_{step}.pt` into the run directory.
- `failing_prepare`: preparing the run directory fails on rank 0 with an unexpected error.
- `with_dropout`: the sl_ddp MLP with dropout after its hidden layer, so every training
  forward draws from each rank's own torch stream (a rank restored with another rank's
  stream trains differently).
- `failing_save`: at the first validation, rank 0 limits its file size (RLIMIT_FSIZE, with
  SIGXFSZ ignored), so the next checkpoint write fails with EFBIG as on a full disk (R-CKPT-6).
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal

import numpy
import torch
from torch import nn

from embodichain.learning.sl import LossResult, SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp

DRAWS_ENV = "RECOVERY_DRAWS_DIR"
# Below a checkpoint's size (~70 KiB with failing_save's wide model), above metrics.jsonl's
# by update 150 (~42 KiB at log_every 2, each line holding the time split and every rank's
# memory: the failure may be heard that late), so only the checkpoint write fails.
FILE_SIZE_LIMIT = 52 * 1024
FAILING_SAVE_HIDDEN = 512


def _trainer(config: sl_ddp.SlDdpConfig, device: torch.device, *, model: nn.Module | None = None,
             objective=sl_ddp.masked_mse, callbacks=()) -> SupervisedTrainer:
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed)).to(device)
    validation = sl_ddp.make_corpus(config.data.val_size, sl_ddp.validation_seed(config.data.seed))

    def evaluate(model: nn.Module, device: torch.device) -> dict[str, float]:
        batch = {k: v.to(device) for k, v in validation.items()}
        return {"validation/mse": sl_ddp.masked_mse(model, batch).loss.item()}

    return SupervisedTrainer(config, model=model or sl_ddp.make_model(config.model.hidden),
                             source=source, objective=objective, device=device,
                             evaluate=evaluate, callbacks=callbacks)


# -- per-rank RNG streams and buffers ----------------------------------------------------------


class CountingMLP(nn.Module):
    """The sl_ddp MLP plus a buffer summing the inputs this rank has trained on."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = sl_ddp.make_model(hidden)
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.seen += x.sum(0)
        return self.net(x)


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def drawing_objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    rank = _rank()
    draws = {"torch": torch.rand(2).tolist(), "python": random.random(),
             "numpy": float(numpy.random.rand())}
    if rank == 1:  # rank 1 consumes more of every stream than rank 0
        draws["extra"] = [torch.randn(5).tolist(), [random.random() for _ in range(3)],
                          numpy.random.rand(7).tolist()]
    directory = os.environ.get(DRAWS_ENV)
    if directory:
        with open(os.path.join(directory, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps(draws) + "\n")
    return sl_ddp.masked_mse(model, batch)


def per_rank_draws(config: sl_ddp.SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    return _trainer(config, device, model=CountingMLP(config.model.hidden),
                    objective=drawing_objective)


per_rank_draws.config_schema = sl_ddp.SlDdpConfig


# -- per-rank randomness in the model: dropout ------------------------------------------------


def with_dropout(config: sl_ddp.SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    hidden = config.model.hidden
    model = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Dropout(0.25),
                          nn.Linear(hidden, 2))
    return _trainer(config, device, model=model)


with_dropout.config_schema = sl_ddp.SlDdpConfig


# -- R-VAL-2: save from a validation callback ----------------------------------------------------


class SaveDuringValidation:
    def on_validation(self, trainer: SupervisedTrainer, metrics: dict[str, float]) -> None:
        trainer.save(trainer.run_directory / f"during_validation_{trainer.step}.pt")


def save_in_validation(config: sl_ddp.SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    return _trainer(config, device, callbacks=[SaveDuringValidation()])


save_in_validation.config_schema = sl_ddp.SlDdpConfig


# -- R-CKPT-6: a save that fails on rank 0 -------------------------------------------------------


class FillTheDisk:
    def on_validation(self, trainer: SupervisedTrainer, metrics: dict[str, float]) -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes then fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))


def failing_save(config: sl_ddp.SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    return _trainer(config, device, model=sl_ddp.make_model(FAILING_SAVE_HIDDEN),
                    callbacks=[FillTheDisk()])


failing_save.config_schema = sl_ddp.SlDdpConfig


# -- a failure while rank 0 prepares the run directory -------------------------------------------


def failing_prepare(config: sl_ddp.SlDdpConfig, device: torch.device) -> SupervisedTrainer:
    """On rank 0, publishing the run lock's holder (the last step of preparing the run
    directory) raises an unexpected error, as a bug would: not a refusal, a failure."""
    if _rank() == 0:
        from embodichain.core.runs.run_lock import RunLock

        def publish(self, *args, **kwargs):
            raise RuntimeError("simulated failure while preparing")

        RunLock.publish = publish
    return _trainer(config, device)


failing_prepare.config_schema = sl_ddp.SlDdpConfig
