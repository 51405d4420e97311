"""The closed-loop evaluation inside validation (R-EVAL-1, R-EVAL-2): what the trainer runs.

Every rank, whatever the strategy, runs its share of the episodes with the acting weights
(the unwrapped model, or the EMA's per `evaluation.acting`) in eval mode, without gradients
and without disturbing the training RNG streams; ranks step in lockstep when the
strategy's forward is collective (FSDP). A failure of the evaluation itself (the policy
raises; an environment's faults only fail their episodes) stops that rank at once, naming
it, as a failed FSDP validation does: its peers may be inside a collective of the
evaluation. Rank 0 writes the records and films under the run directory and hands the
films to the loggers that show videos (TensorBoard, W&B).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from embodichain.core.checkpoint.rank_state import preserved_rng
from embodichain.core.distributed import process_group
from embodichain.core.distributed.stop_request import StopRequest, signal_name
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.admission import (
    check_first_act,
    describe_interface,
    refuse_demonstration_seeds,
    warn_unknown_seeds,
)
from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation, Interrupted, Overrides
from embodichain.core.evaluation.policy import MakeJudge, MakePolicy, Success
from embodichain.core.evaluation.records import (
    EVALUATIONS,
    INTERRUPTED,
    EvaluationResult,
    evaluation_name,
)
from embodichain.core.observe.progress import log
from embodichain.core.training.strategies import ValidationFailed


class Evaluating(Protocol):
    """What of a trainer the evaluation uses (a `SupervisedTrainer` is one)."""

    closed_loop: ClosedLoopEvaluation | None
    learner: Any
    device: torch.device
    step: int
    run: Any
    demonstration_seeds: list[int]

SUCCESS_RATE = ("validation/success_rate", "max")


def closed_loop_of(config: Any, policy: MakePolicy | None, success: Success | None,
                   judge: MakeJudge | None = None) -> ClosedLoopEvaluation | None:
    """The recipe's evaluation with the factory's policy (None without an evaluation
    section); refuses (UsageError, exit 2) a section without a policy and an environment
    that cannot be built."""
    section = getattr(config, "evaluation", None)
    if section is None:
        return None
    return ClosedLoopEvaluation(section, policy, success,
                                factory=f"factory {getattr(config, 'factory', '?')!r}",
                                judge=judge)


def check_acting(trainer: Evaluating, factory: str) -> None:
    """Before training (and `eval`), on every rank: the policy acts once on a reset
    observation; a misfit is refused naming both sides (R-EVAL-6). The recipe's evaluation
    seeds among `trainer.demonstration_seeds` are refused too, or are warned about where
    those are unknown (`trainer.unknown_seeds`)."""
    closed_loop = trainer.closed_loop
    if closed_loop is None:
        return
    c = closed_loop.config
    refuse_demonstration_seeds(c.seed, c.episodes, trainer.demonstration_seeds,
                               "evaluation.seed")
    if c.test_seed is not None:  # the test seeds too (R-TRUST-2)
        refuse_demonstration_seeds(c.test_seed, c.test_episodes or c.episodes,
                                   trainer.demonstration_seeds, "evaluation.test_seed")
    if process_group.is_rank_zero():  # trainers rebuilt to act (eval) know none: no repeat
        warn_unknown_seeds(c.seed, c.episodes, getattr(trainer, "unknown_seeds", None),
                           "evaluation.seed")
    ema = c.acting == "ema" and trainer.learner.ema is not None
    with acting_weights(trainer, ema) as model, preserved_rng(trainer.device), \
            torch.no_grad():
        declared = getattr(model, "interface", None)
        try:
            takes = (describe_interface(declared()["observations"]) if callable(declared)
                     else None)
        except Exception:  # noqa: BLE001 - a model's own description is only a hint here
            takes = None
        model.eval()
        try:
            check_first_act(c, closed_loop.make_policy(model, trainer.device),
                            (closed_loop.facts.observation_space,
                             closed_loop.facts.action_space),
                            takes, f"the policy of factory {factory!r}")
        finally:
            model.train()


def acting_weights(trainer: Evaluating, ema: bool) -> AbstractContextManager[torch.nn.Module]:
    """`with acting_weights(trainer, ema) as model:` the weights that act, in a module of the
    model's own class: the unwrapped model, or one holding the EMA's weights (R-EVAL-5)."""
    if ema:
        if trainer.learner.ema is None:
            raise ValidationFailed("the EMA's weights were asked to act, but the run keeps "
                                   "no EMA (trainer.ema)")
        return trainer.learner.ema.acting()
    return contextlib.nullcontext(trainer.learner.model)


def run_closed_loop(trainer: Evaluating, *, ema: bool | None = None,
                    overrides: Overrides | None = None, progress: Any = None,
                    lockstep: bool = False, stop: StopRequest | None = None
                    ) -> EvaluationResult | None:
    """The evaluation on every rank (collective); rank 0's result, None elsewhere.
    `lockstep` (the same on every rank): step together even where the strategy's forward
    is not collective (`eval`: rank 0's progress bar counts every rank's episodes). `stop`
    (given on every rank or none): a stop asked on any rank cuts it short, `Interrupted`."""
    closed_loop = trainer.closed_loop
    assert closed_loop is not None
    if ema is None:
        ema = closed_loop.config.acting == "ema"
    lockstep = lockstep or trainer.learner.strategy.collective_forward
    with acting_weights(trainer, ema) as model, preserved_rng(trainer.device), \
            torch.no_grad():
        model.eval()
        try:
            return closed_loop.run(model, trainer.device, lockstep=lockstep,
                                   overrides=overrides or Overrides(), progress=progress,
                                   stop=stop)
        except (ValidationFailed, Interrupted, UsageError):  # UsageError: eval's --videos, refused
            raise
        except Exception as exc:
            raise ValidationFailed(
                f"the closed-loop evaluation failed on rank {process_group.rank()} at update "
                f"{trainer.step}: {type(exc).__name__}: {exc}") from exc
        finally:
            model.train()


def record_closed_loop(trainer: Evaluating, result: EvaluationResult
                       ) -> dict[str, float]:
    """Rank 0: write the evaluation's records and films under the run directory, show the
    films to the video loggers; the metrics to record."""
    run = trainer.run
    assert run is not None
    name = evaluation_name(trainer.step)
    folder = run.directory / EVALUATIONS
    films = result.write(folder / f"{name}.jsonl", folder / name, run.directory)
    writer = run.metrics
    if films and writer is not None and hasattr(writer, "write_videos"):
        writer.write_videos(trainer.step, {f"evaluation/episode_{e}": (path, result.films[e])
                                           for e, path in films.items()}, result.fps)
    return {**result.metrics(), "time/evaluation_s": result.wall_s}


def record_interrupted(trainer: Evaluating, cut: Interrupted) -> Path:
    """Rank 0: an evaluation cut short by a stop is no metric and no best (R-EVAL-4): the
    episodes it finished go to `evaluations/update_UUUUUU.interrupted.jsonl` (no films), and
    the log says so. The snapshot of its update says that the validation is still due."""
    run = trainer.run
    assert run is not None and cut.finished is not None
    path = run.directory / EVALUATIONS / f"{evaluation_name(trainer.step)}{INTERRUPTED}"
    finished = EvaluationResult(cut.finished.records, fps=cut.finished.fps)
    finished.write(path, path.with_suffix(""), run.directory)
    log.info("the validation at update %d was cut short by %s after %d of %d episodes: "
             "not a metric and not a best (its episodes are in %s); resuming runs it again "
             "first", trainer.step, signal_name(cut.signum), len(finished.records),
             cut.episodes, path)
    return path
