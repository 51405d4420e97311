"""A validation at an update: the closed loop on every rank, the factory's `evaluate` where
the strategy runs it, and on rank 0 the record, the best-metric standing and the callbacks
(R-VAL-1, R-MET-1, R-EVAL-1).

A stop asked during the closed loop cuts it short on every rank at the same step (the ranks
agree between steps, R-EVAL-4): nothing of it is a metric, `evaluate` and the callbacks do not
run, rank 0 records the episodes it finished as interrupted, and the trainer, told the stop's
signal, saves the update's snapshot with this validation still due (`validation_due`), so
that resuming runs it first and the run goes on as if it had never stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from embodichain.core.checkpoint.rank_state import preserved_rng
from embodichain.core.distributed import process_group
from embodichain.core.distributed.stop_request import StopRequest
from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation, Interrupted
from embodichain.core.evaluation.policy import MakeJudge, MakePolicy, Success
from embodichain.core.observe.progress import ProgressReporter, log
from embodichain.core.recipe.best import Best, MetricMissing, choose_best
from embodichain.core.training.callbacks import SaveBest, ValidationCallback
from embodichain.core.training.ema import validation_models
from embodichain.core.training.evaluating import (
    SUCCESS_RATE,
    closed_loop_of,
    record_closed_loop,
    record_interrupted,
    run_closed_loop,
)
from embodichain.core.training.strategies import ValidationFailed


def validation_setup(config: Any, evaluate: Any, callbacks: Sequence[ValidationCallback],
                     best: Best | tuple[str, str] | None, policy: MakePolicy | None,
                     success: Success | None, judge: MakeJudge | None = None
                     ) -> tuple[ClosedLoopEvaluation | None, Best, list[ValidationCallback]]:
    """A trainer's closed loop: the recipe's evaluation section with the factory's policy
    and episode judge (refused, exit 2, before training without a policy or a buildable
    environment); its best metric: the recipe's trainer.best, else the factory's `best`,
    else the success rate of a closed loop alone (higher is better), else validation/mse;
    its callbacks, with `trainer.save_best`'s SaveBest appended last, so that the factory's
    own keep their checkpoint keys whether or not it is on."""
    closed_loop = closed_loop_of(config, policy, success, judge)
    if best is None and evaluate is None and closed_loop is not None:
        best = SUCCESS_RATE
    chosen = choose_best(config.trainer, best, evaluate is not None or closed_loop is not None)
    callbacks = list(callbacks)
    if config.trainer.save_best and not any(isinstance(cb, SaveBest) for cb in callbacks):
        callbacks.append(SaveBest(chosen.metric, mode=chosen.mode))
    return closed_loop, chosen, callbacks


class Validated(Protocol):
    """What of a trainer a validation uses (a `SupervisedTrainer` is one)."""

    config: Any
    device: torch.device
    evaluate: Callable[[torch.nn.Module, torch.device], dict[str, float]] | None
    closed_loop: ClosedLoopEvaluation | None
    callbacks: list[Any]
    learner: Any
    checkpoints: Any
    tracker: Any
    best: Any
    step: int
    run: Any
    validation_due: bool


class Validation:
    """A trainer's validations; `record(values)` writes rank 0's metrics at its step."""

    def __init__(self, trainer: Validated, record: Callable[[Mapping[str, Any]], None]
                 ) -> None:
        self.trainer, self.record = trainer, record

    @property
    def configured(self) -> bool:
        return self.trainer.evaluate is not None or self.trainer.closed_loop is not None

    def __call__(self, progress: ProgressReporter, stop: StopRequest | None) -> int | None:
        """Validate this update on every rank. The strategy evaluates where it validates
        (DDP: rank 0; FSDP: every rank); rank 0 records, and its callbacks may `save()`
        (written as validation ends). Returns the stop signal every rank agreed on when a
        stop cut it short (the validation is then still due), else None."""
        trainer = self.trainer
        if not self.configured:
            trainer.validation_due = False
            return None
        try:
            cut, failure = self._here(progress, stop)
            # Other ranks wait here; a failure on rank 0 stops every rank instead of hanging
            # it. Every rank takes rank 0's standing on the best metric: all agree on an
            # early stop.
            outcome = process_group.raise_if_rank_zero_failed(
                failure, f"validation failed on rank 0 at update {trainer.step}",
                f"rank 0 at update {trainer.step}", best_tracker=trainer.tracker.state_dict())
        except RuntimeError as exc:  # a peer gone: its own validation failure, if it left one
            cause = process_group.failure_left_by_peers()
            if cause is None:
                raise
            raise ValidationFailed(cause) from exc
        trainer.tracker.load_state_dict(outcome["best_tracker"])
        trainer.validation_due = cut is not None
        return cut

    def _here(self, progress: ProgressReporter, stop: StopRequest | None
              ) -> tuple[int | None, str | None]:
        """This rank's part: the stop that cut the closed loop short (every rank), and rank
        0's failure (None: none), for the others."""
        trainer, failure = self.trainer, None
        with trainer.checkpoints.validating(trainer):
            # The closed loop first, on every rank (collective; a failure stops its rank).
            try:
                closed = run_closed_loop(trainer, stop=stop) \
                    if trainer.closed_loop is not None else None
            except Interrupted as cut:
                if cut.finished is not None:  # rank 0: a record, never worth failing a stop
                    try:
                        record_interrupted(trainer, cut)
                    except Exception:
                        log.exception("the interrupted validation's episodes were not "
                                      "recorded")
                return cut.signum, None
            try:
                metrics = (trainer.learner.strategy.validate(self._evaluate, trainer.step)
                           if trainer.evaluate is not None
                           else {} if process_group.is_rank_zero() else None)
                if metrics is not None:  # rank 0
                    if closed is not None:
                        metrics.update(record_closed_loop(trainer, closed))
                    self.record(metrics)
                    self.show(progress, metrics)
                    early = trainer.config.trainer.early_stop
                    trainer.tracker.observe(trainer.step, metrics,
                                            early.min_delta if early else 0.0)
                    for callback in trainer.callbacks:
                        callback.on_validation(trainer, metrics)
            except ValidationFailed:  # this rank stops alone (its peers may be in a collective)
                raise
            except MetricMissing as exc:  # the recipe's mistake: its message only
                failure = str(exc)
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
                log.exception("validation failed at update %d", trainer.step)
            # Ran to its end: the saves its callbacks asked for, written as the `with` ends,
            # hold a state whose validation is done (a resume from one must not repeat it).
            trainer.validation_due = False
        return None, failure

    def show(self, progress: ProgressReporter, metrics: Mapping[str, float]) -> None:
        """The bar's validation field: the best metric's value (R-UX-1, R-MET-1), from a
        validation's metrics or, after a resume, the ones the checkpoint restored."""
        progress.update(self.trainer.step, val=metrics.get(self.trainer.best.metric))

    def _evaluate(self) -> dict[str, float]:
        """The factory's `evaluate` on each validated model (the model's, the EMA's), in
        eval mode, without gradients or a trace in the RNG streams."""
        trainer = self.trainer
        assert trainer.evaluate is not None
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        ema = trainer.config.trainer.ema
        for weights, named in validation_models(trainer.learner.model, trainer.learner.ema,
                                                ema.validate if ema is not None else None):
            with weights() as model, preserved_rng(trainer.device), torch.no_grad():
                model.eval()
                try:
                    metrics.update(named({k: float(v) for k, v in
                                          trainer.evaluate(model, trainer.device).items()}))
                finally:
                    model.train()
        metrics["time/validation_s"] = time.perf_counter() - start
        return metrics
