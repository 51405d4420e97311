"""The NeRD cart-pole recipe factory (entry point `nerd`).

Builds, on every rank: the dataset (memory-mapped, so ranks on one node share its pages),
the transformer with normalisation statistics of the training split as buffers, a source of
history windows, the objective, and the rank-0 rollout evaluation. Everything is a
deterministic function of the recipe and the data files, so exact resume holds.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from embodichain.core.file_hash import file_sha256
from embodichain.learning.sl import LossResult, SupervisedTrainer, UsageError
from embodichain_models.dynamics.nerd.data import WindowSource, normalization_stats
from embodichain_models.dynamics.nerd.evaluation import RolloutEvaluator
from embodichain_models.dynamics.nerd.model import STATE_DIM, NerdModelConfig, NerdTransformer
from embodichain_models.dynamics.nerd.physics import STATE_NAMES
from embodichain_models.dynamics.nerd.prepare import load_split
from embodichain_models.dynamics.nerd.schema import NerdConfig

__all__ = ["NerdConfig", "build_supervised_trainer", "make_objective"]


def make_objective(last_position_only: bool):
    """Mean squared error of the normalised Δstate, over all positions or the last one.

    The weight is the number of supervised predictions, so ranks combine into the exact
    global mean. Per-dimension errors are logged as `train/mse_<dim>`.
    """

    def objective(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
        pred = model(batch["states"], batch["actions"]).float()  # [B, W, 4], normalised
        core = getattr(model, "module", model)  # DDP wraps the model; the buffers are inside
        target = core.normalize_target(batch["deltas"].float())
        err = (pred - target).square()
        if last_position_only:
            err = err[:, -1:]
        per_dim = err.reshape(-1, STATE_DIM).mean(0)
        metrics = {f"mse_{name}": per_dim[i] for i, name in enumerate(STATE_NAMES)}
        return LossResult(loss=err.mean(), weight=float(err.shape[0] * err.shape[1]),
                          metrics=metrics)

    return objective


def _load(path: Path, mmap: bool) -> dict:
    try:
        return load_split(path, mmap=mmap)
    except (RuntimeError, OSError, ValueError) as exc:
        raise UsageError(f"cannot load the NeRD dataset {path}: {exc}") from exc


def build_supervised_trainer(config: NerdConfig, device: torch.device) -> SupervisedTrainer:
    """Factory of the NeRD cart-pole recipe; called on every rank inside `distributed_run`."""
    # `precision:` is a deprecated alias, already copied to trainer.precision by the schema;
    # the trainer refuses a precision the device cannot run (R-LOOP-4).
    train = _load(config.data.train, config.data.mmap)
    val = _load(config.data.val, config.data.mmap)
    if train["physics"] != val["physics"]:
        raise UsageError(f"{config.data.train} and {config.data.val} were simulated with "
                         "different physics parameters; prepare both splits together")
    window = config.model.window
    for path, split in ((config.data.train, train), (config.data.val, val)):
        if split["actions"].shape[1] < window:
            raise UsageError(f"{path}: trajectories of {split['actions'].shape[1]} steps are "
                             f"shorter than model.window ({window})")

    model = NerdTransformer(
        NerdModelConfig(
            layers=config.model.layers,
            d_model=config.model.d_model,
            heads=config.model.heads,
            window=window,
            causal=config.attention.causal,
            dropout=config.model.dropout,
            norm_eps=config.normalization.eps,
        ),
        seed=config.seed,
    )
    model.set_normalization(**normalization_stats(train["states"], train["actions"]))

    # The identity names the content (not the path) and how it is cut into examples.
    identity = f"nerd-cartpole:window={window}:sha256={file_sha256(config.data.train)}"
    source = WindowSource(train["states"], train["actions"], window, identity)

    n_val = config.validation.max_trajectories
    evaluate = RolloutEvaluator(val["states"][:n_val], val["actions"][:n_val],
                                dt=float(val["physics"]["dt"]),
                                horizons=config.validation.horizons)
    return SupervisedTrainer(
        config,
        model=model,
        source=source,
        objective=make_objective(config.loss.mask == "last_position"),
        device=device,
        evaluate=evaluate,
    )


build_supervised_trainer.config_schema = NerdConfig
