"""Run a recipe on every worker: fresh, from a checkpoint, in place, or auto.

How the run starts is decided by rank 0 and heard by every rank (start.py), so a refusal is
decided (and printed) once and all ranks exit with the same code (R-DIST-5, design §9).
SIGINT / SIGTERM stop every rank at the same update with a snapshot (R-SIG-1).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint import initial_weights
from embodichain.core.checkpoint.initial_weights import InitFrom
from embodichain.core.checkpoint.rank_state import seed_streams
from embodichain.core.data.samplers import stream_seed
from embodichain.core.distributed import determinism, process_group
from embodichain.core.distributed.stop_request import StopRequest, ignore_sigterm
from embodichain.core.errors import (
    Stopped,
    UsageError,
    refusal_in_chain,
    refused_by_determinism,
)
from embodichain.core.launch.start import StartOutcome, agree_on_start
from embodichain.core.observe.loggers import LoggingMetricsWriter, check_loggers
from embodichain.core.observe.progress import configure_logging, log
from embodichain.core.observe.summary import Status, print_run_summary
from embodichain.core.observe.work_progress import showing_progress
from embodichain.core.recipe.loading import Recipe
from embodichain.core.runs.fresh_claim import ClaimSite, take_back
from embodichain.core.runs.resume_policy import Start, config_differences, resume_problems
from embodichain.core.runs.run_dir import read_run_json
from embodichain.core.runs.run_end import record_failure
from embodichain.core.runs.run_lock import RunLock
from embodichain.core.training.trainer import RunContext, SupervisedTrainer


def train(recipe: Recipe, *, start: Start | None = None, show_progress: bool = True,
          init_from: InitFrom | None = None) -> dict[str, float]:
    """Build the recipe's trainer on every rank, prepare the run directory and fit.

    `start` says how the run begins (fresh by default; see resume_policy.Start). This is
    the programmatic path (`build_trainer` inside `distributed_run`, then `fit()`) with the
    stop signals installed before the process group exists, so that a signal during
    set-up stops at the first update.
    """
    configure_logging(process_group.env_rank())
    check_loggers(recipe.config.trainer.loggers)  # a missing extra: refused before anything
    # First: cuBLAS and NCCL read their variables once, when CUDA work or the group starts.
    with determinism.applied(recipe.config.trainer.deterministic), StopRequest() as stop, \
            process_group.distributed_run(recipe.config.device) as device:
        with showing_progress(show_progress):  # opening the data (hashing it) can be long
            trainer = build_trainer(recipe, device, start=start, init_from=init_from)
        return trainer.fit(show_progress=show_progress, stop=stop)


def build_trainer(recipe: Recipe, device: torch.device, *, start: Start | None = None,
                  init_from: InitFrom | None = None) -> SupervisedTrainer:
    """The recipe's trainer from its factory, with the model initialised from the seed
    (on every rank alike); inside `distributed_run`, on every rank.

    Its `fit()` then runs as `train-sl` does (R-API-1): the run directory claimed, locked
    and resumed by `start`'s rules (fresh by default), stop signals honoured with a
    snapshot, the summary printed, and the trainer closed at the end. `init_from`: a new
    run whose model starts from those weights (rank 0 reads them, every rank loads them
    into the factory's model before its strategy spreads it); never with a resume.
    """
    start = start or Start()
    if init_from is not None and start.kind not in ("fresh", "auto"):
        raise UsageError("--init-from starts a new run from a checkpoint's weights and "
                         f"--resume continues one ({start.kind}); give only one of them")
    weights = None
    if init_from is not None:
        output_dir = Path(recipe.config.trainer.output_dir)
        weights = initial_weights.agree(init_from, lambda: _reads_initial_weights(
            start, output_dir, init_from))
    seed_streams(recipe.config.seed)
    try:
        with initial_weights.pending(weights):
            trainer = recipe.factory(recipe.config, device)
    except Exception as exc:
        if isinstance(exc, UsageError) or refusal_in_chain(exc) is not None:
            _refused_by_the_factory()
        raise
    if not isinstance(trainer, SupervisedTrainer):
        raise UsageError(f"factory {recipe.config.factory} returned {type(trainer).__name__}, "
                         "not a SupervisedTrainer")
    trainer.run_opener = RunOpener(recipe, start, device,
                                   weights.record if weights is not None else None)
    return trainer


def _reads_initial_weights(start: Start, output_dir: Path, init_from: InitFrom) -> bool:
    """On rank 0: whether `--init-from` weights are read. With `--resume auto` (a
    `--max-restarts` restart, a requeued job) only at the run's first start: a run already
    in `output_dir` continues from its own snapshots, as `--resume auto` decides."""
    if start.kind == "fresh" or read_run_json(output_dir) is None:
        return True
    log.info("--init-from %s: not read: --resume auto continues the run in %s from its own "
             "snapshots (the initial weights are read only at its first start)",
             init_from.path, output_dir)
    return False


def _refused_by_the_factory() -> None:
    """Every rank's factory refuses the same data (or recipe), each on its own: let each end
    with exit 2. torchrun stops the other workers with SIGTERM once the first has exited;
    one still in its factory only records it (StopRequest) and refuses in turn, and from
    here on this rank ignores it, so that its own code, not -15, is what torchrun reports
    (and a self-launch sees a refusal on every worker: not retried, R-PROC-3)."""
    if process_group.is_distributed():
        ignore_sigterm()  # until exit in the CLI; a program gets it back (distributed_run)


@dataclass
class RunOpener:
    """What a built trainer's first `fit()` runs: the run around the fit loop."""

    recipe: Recipe
    start: Start
    device: torch.device
    initialized_from: dict[str, Any] | None = None  # run.json's record of --init-from

    def __call__(self, trainer: SupervisedTrainer, show_progress: bool,
                 stop: StopRequest | None) -> dict[str, float]:
        config = self.recipe.config
        if not log.handlers:  # a program that calls fit() itself: train-sl's logging
            configure_logging(process_group.env_rank())
        check_loggers(config.trainer.loggers)
        lock = RunLock(Path(config.trainer.output_dir))
        with contextlib.ExitStack() as scope:
            # Again for a program's own distributed_run + fit() (train() has set it
            # already); undone when the fit ends, for a program that goes on (R-DET-1).
            for note in scope.enter_context(determinism.applied(config.trainer.deterministic)):
                if process_group.is_rank_zero():
                    log.info("%s", note)
            if stop is None:  # a program's own fit(): signals stop it as they stop train-sl
                stop = scope.enter_context(StopRequest())
            scope.callback(lock.release)
            scope.callback(trainer.close)
            # Ranks share the model init; from here on each has its own streams.
            seed_streams(stream_seed(config.seed, process_group.rank()) % (2**32))
            outcome = agree_on_start(self.recipe, trainer, self.start, lock,
                                      self.initialized_from)
            if outcome.complete is not None:
                if process_group.is_rank_zero():
                    log.info("%s", outcome.complete)
                return {}
            _attach_run(trainer, self.recipe, outcome, self.device)
            return _fit_and_summarize(trainer, stop, show_progress, outcome.claimed)


def check_by_building(recipe: Recipe) -> None:
    """Build the recipe's trainer in this process and close it again, training nothing and
    writing nothing: what only the factory decides (its parameter groups, its source, an
    evaluate for trainer.save_best) is refused as train-sl would refuse it (UsageError)."""
    configure_logging(0)  # the build's warnings, as train-sl shows them
    with process_group.distributed_run(recipe.config.device) as device, \
            showing_progress(True):  # opening the data (hashing it) can be long
        build_trainer(recipe, device).close()


def _attach_run(trainer: SupervisedTrainer, recipe: Recipe, outcome: StartOutcome,
                device: torch.device) -> None:
    """Give the trainer its run directory, identity and (rank 0) metrics writer."""
    config = recipe.config
    directory = Path(config.trainer.output_dir)
    continued = outcome.continued
    assert outcome.identity is not None
    metrics = None
    if process_group.is_rank_zero():
        metrics = LoggingMetricsWriter(directory, config.trainer.loggers,
                                       trainer.step if continued else None,
                                       identity=outcome.identity)
    trainer.attach(RunContext(directory, outcome.identity, metrics))
    if process_group.is_rank_zero():
        for note in outcome.notes:
            log.info("%s", note)
        log.info("run %s: %s in %s (world size %d, device %s)",
                 outcome.identity["run_id"][:12],
                 f"resuming at update {trainer.step}" if continued else "training",
                 directory, process_group.world_size(), device)


def _fit_and_summarize(trainer: SupervisedTrainer, stop: StopRequest, show_progress: bool,
                       claimed: dict[str, Any] | None = None) -> dict[str, float]:
    """Fit; whatever the end, rank 0 then says what exists and how to continue (R-UX-2).

    The error itself is printed after the summary, by the CLI. A closed stdout must not
    turn a finished run into a failure. A freshly `claimed` directory is given back when the
    run ends before its first update (runs/fresh_claim).
    """
    start_step, started = trainer.step, time.perf_counter()
    status: Status = "failed"
    failed: BaseException | None = None
    try:
        final = trainer.fit(show_progress=show_progress, stop=stop)
        status = "finished"
        return final
    except (Stopped, KeyboardInterrupt):
        status = "stopped"
        raise
    except Exception as exc:  # an operation trainer.deterministic refuses: say so, plainly
        # The others' watch learns that this rank failed and says so itself (R-OPS-1).
        process_group.leave_failure(str(exc))
        refused = refused_by_determinism(exc, trainer.step + 1)
        failed = exc if refused is None else refused
        if refused is None:
            raise
        raise refused from exc
    finally:
        if process_group.is_rank_zero() and not (
                status != "finished" and claimed and trainer.step == start_step
                and _give_back(trainer, claimed)):
            if failed is not None:
                with contextlib.suppress(OSError, ValueError):  # the run's word, if it can
                    record_failure(trainer.run_directory, trainer.step + 1, failed)
            with contextlib.suppress(OSError):
                print_run_summary(trainer.run_directory, status=status, start_step=start_step,
                                  end_step=trainer.step, wall_s=time.perf_counter() - started)


def _give_back(trainer: SupervisedTrainer, claimed: dict[str, Any]) -> bool:
    """Undo the claim of a run that did no update (rank 0); whether anything was removed."""
    directory = trainer.run_directory
    removed = take_back(ClaimSite.from_json(claimed), trainer.run.identity["run_id"])
    if removed:
        log.info("the run ended before its first update: removed what it had created in %s "
                 "(%s), so the same command can start it again", directory, ", ".join(removed))
    return bool(removed)


__all__ = ["train", "resume_problems", "config_differences"]
