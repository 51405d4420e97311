"""The strategy interface (R-STRAT-1): how a model is spread over the ranks.

A `Strategy` owns everything that differs between keeping the whole model on every rank
(DDP) and sharding it (FSDP): preparing and wrapping the model, the micro-batch loop and its
one gradient reduction per update (the weighted update of R-DIST-3), clipping, the EMA, the
part of the state a checkpoint holds and how each rank gets its part back, where validation
runs, and freeing what it holds. The learner, trainer, checkpointing and launch ask their
strategy; none of them tests which one it is. What a strategy cannot be combined with is
refused when the recipe is validated (core/recipe/strategy_limits.py), so validate-config
refuses exactly what train-sl refuses.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from embodichain.core.checkpoint.formats import SINGLE_FILE, CheckpointFormat
from embodichain.core.checkpoint.sharded import SHARD_DIRECTORY, check_compatible
from embodichain.core.checkpoint.writer import SaveJob
from embodichain.core.distributed import process_group
from embodichain.core.errors import TrainingError
from embodichain.core.runs.elastic import global_batch_size
from embodichain.core.training.objective import LossResult, Objective, check_loss_result

Batch = dict[str, torch.Tensor]
Statistics = Callable[[LossResult], torch.Tensor]


class Trained(Protocol):
    """What a strategy reads and loads of the learner (a `Learner` is one)."""

    model: nn.Module  # unwrapped: what is saved and validated
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: Any  # Ema, ShardedEma or None


class ValidationFailed(TrainingError):
    """A rank's validation failed where its peers may be inside a collective: it stops
    alone, at once, and the launcher ends the others (no collective would reach them)."""


@dataclass
class Snapshot:
    """One save, as the checkpointing hands it to the strategy (on every rank)."""

    step: int
    path: Path
    directory: Path  # the run's directory
    identity: Mapping[str, Any]  # the run's identity (run_id, config_sha256, ...)
    own: dict[str, Any]  # this rank's state: RNG streams, sampler position, buffers
    payload: dict[str, Any] | None  # rank 0: the run's part and the callbacks'; else None
    also_as: Path | None = None
    before_publish: Callable[[], None] | None = None
    after_publish: Callable[[], None] | None = None


@dataclass(frozen=True)
class SpreadOptions:
    """What the factory and the recipe say about spreading the model (`shard_blocks`,
    `trainer.fsdp`); each strategy reads what applies to it."""

    shard_blocks: Sequence[nn.Module] = ()
    reshard_after_forward: bool = True


class Strategy(ABC):
    """One way of spreading the model over the ranks; built by the learner, on every rank."""

    name: str  # the value of `trainer.strategy`
    # What its checkpoints keep beside their file, as resume-time checks ask it (formats.py)
    checkpoint_format: CheckpointFormat = SINGLE_FILE
    # Whether a forward of the model is a collective (every rank must run it together):
    # the closed-loop evaluation then steps every rank in lockstep (R-EVAL-2).
    collective_forward: bool = False

    def __init__(self, device: torch.device, precision: str,
                 options: SpreadOptions | None = None) -> None:
        self.device = device
        self.precision = precision
        self.options = options or SpreadOptions()

    # -- the model ---------------------------------------------------------------------

    @abstractmethod
    def prepare(self, model: nn.Module, param_groups: Sequence[dict[str, Any]] | None
                ) -> Sequence[dict[str, Any]] | None:
        """Before the optimizer exists: spread `model` over the ranks; the factory's
        parameter groups, on the parameters the optimizer will hold."""

    @abstractmethod
    def make_ema(self, model: nn.Module, decay: float) -> Any:
        """The exponential moving average of the model's parameters (`trainer.ema`)."""

    @abstractmethod
    def wrap(self, model: nn.Module, *, compile: bool) -> nn.Module:
        """After the optimizer and EMA: the module the training forward runs through."""

    # -- the update --------------------------------------------------------------------

    def accumulate(self, trained: nn.Module, objective: Objective,
                   micro_batches: Sequence[Batch], statistics: Statistics,
                   flags: Callable[[], torch.Tensor], scaler: torch.amp.GradScaler
                   ) -> torch.Tensor:
        """Forward and backward of each micro-batch (R-LOOP-1); the global totals
        `[w, w*loss, w*metric..., stop, note]`, summed over every rank and micro-batch, with
        the gradients divided by the global weight. One gradient reduction per update: only
        the last backward reduces, with the summed statistics and `flags()` alongside (read
        once the last micro-batch is loaded: its data wait counts every load)."""
        count = len(micro_batches)
        summed = totals = None
        for k in range(count):
            last = k == count - 1
            with self.micro_batch(last):
                result = check_loss_result(objective(trained, micro_batches[k]), objective)
                local = statistics(result)
                summed = local if summed is None else summed + local
                if last:
                    totals = torch.cat([summed, flags()])
                    self.before_last_backward(totals)
                scaler.scale(result.loss.float() * local[0]).backward()
        assert totals is not None
        return self.reduce(totals)

    @abstractmethod
    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's forward and backward (`last`: it reduces)."""

    def before_last_backward(self, totals: torch.Tensor) -> None:
        """`totals` (this rank's statistics and flags) before the reducing backward: for a
        strategy whose backward reduces them with the gradients (none by default)."""
        return None

    @abstractmethod
    def reduce(self, totals: torch.Tensor) -> torch.Tensor:
        """After the last backward: the global totals, left on the device (R-GPU-1); the
        gradients divided by the global weight (a zero weight leaves zero gradients)."""

    def clip(self, model: nn.Module, max_norm: float) -> None:
        """Clip the global gradient norm (of gradients the learner has unscaled)."""
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)

    # -- checkpoints -------------------------------------------------------------------

    @abstractmethod
    def learner_state(self, learner: Trained) -> dict[str, Any]:
        """The learner's part of rank 0's payload (`payload["learner"]`)."""

    @abstractmethod
    def load_learner_state(self, learner: Trained, state: Mapping[str, Any]) -> None:
        """Load what `learner_state` gave."""

    @abstractmethod
    def save_job(self, learner: Trained, snapshot: Snapshot) -> SaveJob | None:
        """This rank's part of a save (collective: every rank calls it at the same point);
        None when this rank writes nothing."""

    @abstractmethod
    def receive(self, payload: dict[str, Any] | None) -> dict[str, Any]:
        """A checkpoint payload read on rank 0 (None elsewhere): what this rank restores
        from (collective; the payload is checked against this strategy on every rank)."""

    @abstractmethod
    def restore(self, learner: Trained, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """Load the learner's state from `payload`; this rank's own saved state (RNG
        streams, sampler, buffers), which the trainer restores next."""

    def check_format(self, payload: Mapping[str, Any]) -> None:
        """Refuse a checkpoint of another strategy, or of another world size unless its
        recipe sets `trainer.global_batch_size` (the resume policy checked this run's)."""
        data = {"manifest": {"world_size": int(payload["run"]["world_size"])},
                "payload": payload}
        elastic = global_batch_size(payload["run"].get("config") or {}) is not None
        check_compatible(data, payload.get("sharded", {}).get(SHARD_DIRECTORY, "the checkpoint"),
                         self.name, None if elastic else process_group.world_size())

    # -- validation and the end --------------------------------------------------------

    @abstractmethod
    def validate(self, evaluate: Callable[[], dict[str, float]], step: int
                 ) -> dict[str, float] | None:
        """Run `evaluate` where this strategy validates; rank 0's metrics (None on the
        other ranks). An exception on rank 0 is reported to the others by the trainer."""

    def release(self) -> None:
        """Free what the strategy holds (wrappers, groups) before the process group goes."""
        return None
