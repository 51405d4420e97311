"""SupervisedTrainer: the fit loop; validations (validating.py) and collective checkpoints."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint.disk_plan import warn_about_checkpoint_plan
from embodichain.core.checkpoint.names import LAST, step_filename
from embodichain.core.data.micro_batches import TimedLoads
from embodichain.core.data.mixture import part_counts
from embodichain.core.data.source import Source
from embodichain.core.distributed import process_group
from embodichain.core.distributed.stop_request import StopRequest
from embodichain.core.errors import DataFailure, TrainingError
from embodichain.core.evaluation.policy import MakeJudge, MakePolicy, Success
from embodichain.core.observe.pace import DataPace
from embodichain.core.observe.progress import ProgressReporter, log
from embodichain.core.recipe.best import Best, BestTracker
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.runs.best_record import record_stopped_early
from embodichain.core.runs.measured import is_measured
from embodichain.core.runs.run_dir import finite_values
from embodichain.core.runs.run_end import record_clean_stop
from embodichain.core.runs.snapshots import where_to_continue
from embodichain.core.training.batches import data_of
from embodichain.core.training.callbacks import ValidationCallback
from embodichain.core.training.checkpointing import Checkpointing, RunContext, require_run
from embodichain.core.training.evaluating import check_acting
from embodichain.core.training.figures import UpdateFigures
from embodichain.core.training.learner import Learner, UpdateResult
from embodichain.core.training.model_facts import UnknownSeeds, recorded
from embodichain.core.training.objective import Objective
from embodichain.core.training.param_groups import ParamGroups
from embodichain.core.training.precision import Precision, trainer_precision
from embodichain.core.training.stops import peer_gone, stopped, stopped_without_snapshot
from embodichain.core.training.validating import Validation, validation_setup
from embodichain.core.training.watching import UpdateWatch

Evaluate = Callable[[nn.Module, torch.device], dict[str, float]]


class SupervisedTrainer:
    """Samples batches, updates the learner, validates on rank 0 and saves checkpoints.

    A factory builds it from the validated recipe; the framework attaches a run directory
    and calls `fit()` on every rank.
    `param_groups` (optional): `[{"params", "lr_scale", "weight_decay", "name"}, ...]`,
    parameter groups with their own learning-rate scale and weight decay (R-LOOP-3; see
    core/training/param_groups.py).
    `policy` (with the recipe's `evaluation` section): `make_policy(model, device) ->
    ClosedLoopPolicy`, judged in closed loop at every validation, on every rank;
    `success(info, reward, terminated) -> bool` judges an episode (default
    `info["is_success"]`); `judge() -> EpisodeJudge` adds outcomes judged from every step
    (R-EVAL-1, docs/evaluation.md). `model_facts`: what the data gave the model (JSON
    values), kept in checkpoints so `eval` and `export` rebuild it without the data
    (R-EVAL-5; `source` is None only then); `demonstration_seeds`: the seeds the data was
    recorded with, refused as evaluation seeds (R-EVAL-6); `UnknownSeeds(why)` where the
    data cannot tell them (each evaluation then warns and records it)."""

    def __init__(
        self,
        config: FrameworkConfig,
        *,
        model: nn.Module,
        source: Source | None,
        objective: Objective,
        device: torch.device,
        evaluate: Evaluate | None = None,
        callbacks: Sequence[ValidationCallback] = (),
        precision: Precision | None = None,
        param_groups: ParamGroups | None = None,
        best: Best | tuple[str, str] | None = None,
        shard_blocks: Sequence[nn.Module] = (),
        policy: MakePolicy | None = None,
        success: Success | None = None,
        judge: MakeJudge | None = None,
        model_facts: Mapping[str, Any] | None = None,
        demonstration_seeds: Sequence[int] | UnknownSeeds = (),
    ) -> None:
        self.config = config
        self.device = device
        self.source = source
        self.model_facts = recorded(model_facts, getattr(config, "factory", "?"))
        self.unknown_seeds: str | None = None  # why they are unknown (R-EVAL-6)
        self.demonstration_seeds: list[int] = []
        if isinstance(demonstration_seeds, UnknownSeeds):
            self.unknown_seeds = demonstration_seeds.why
        else:
            self.demonstration_seeds = sorted({int(s) for s in demonstration_seeds})
        self.objective = objective
        self.evaluate = evaluate
        # The closed loop (R-EVAL-1: refused here, exit 2, before training), the best metric
        # (R-MET-1) and the callbacks, trainer.save_best's last.
        self.closed_loop, self.best, self.callbacks = validation_setup(
            config, evaluate, callbacks, best, policy, success, judge)
        self.tracker = BestTracker(self.best)
        t = config.trainer
        self.learner = Learner(model, config.optimizer, config.scheduler, t.max_updates, device,
                               trainer_precision(t.precision, precision, device),
                               param_groups=param_groups, compile=t.compile,
                               skip_guard=t.skip_guard,
                               ema_decay=t.ema.decay if t.ema is not None else None,
                               strategy=t.strategy, shard_blocks=shard_blocks,
                               reshard_after_forward=t.fsdp is None
                               or t.fsdp.reshard_after_forward,
                               activation_checkpointing=t.activation_checkpointing.modules
                               if t.activation_checkpointing is not None else ())
        # An update draws all its K * batch_size indices at once (R-LOOP-1); the sampler's
        # position is the consumed one, checkpointed.
        self.sampler, self.loader = data_of(config, source, device)
        check_acting(self, getattr(config, "factory", "?"))  # before training (R-EVAL-6)
        self.step = 0
        self.run: RunContext | None = None
        self.last_metrics: dict[str, float] = {}
        # Saves go through one writer per rank (in the background unless async_save is off),
        # also those of validation callbacks (R-CKPT-8, R-VAL-2); the strategy says what
        # each rank writes (R-SHARD-2).
        self.checkpoints = Checkpointing(t, device)
        # Validations (core/training/validating.py); `validation_due`: this update's, which
        # a stop skipped or cut short, runs first when the run goes on (R-EVAL-4).
        self.validation = Validation(self, self._record)
        self.figures = UpdateFigures(self, self._record)  # what an update's figures ask for
        self.watch = UpdateWatch(t, device)  # profile, time split, memory (R-OPS-2, R-OPS-3)
        self.validation_due = False
        # Set by the framework's `build_trainer` (core/launch): the first `fit()` without an
        # attached run hands over to it, which attaches one as train-sl does (R-API-1).
        self.run_opener: Callable[[SupervisedTrainer, bool, StopRequest | None],
                                  dict[str, float]] | None = None

    @property
    def model(self) -> nn.Module:
        """The unwrapped model."""
        return self.learner.model

    @property
    def run_directory(self) -> Path:
        return require_run(self).directory

    # -- the loop ----------------------------------------------------------------------

    def fit(self, show_progress: bool = True, stop: StopRequest | None = None
            ) -> dict[str, float]:
        """Train to `trainer.max_updates`, validating, logging and saving on schedule.

        When `stop` is requested on any rank, every rank finishes the same update, saves a
        snapshot of it and raises Stopped (R-SIG-1); a validation due or running then is
        skipped or cut short, and runs first when the run goes on (R-EVAL-4). A trainer
        built by `build_trainer` (the CLI, or a program) first gets its run directory.
        """
        if self.run is None and self.run_opener is not None:
            opener, self.run_opener = self.run_opener, None
            return opener(self, show_progress, stop)
        t = self.config.trainer
        run = require_run(self)
        rank_zero = process_group.is_rank_zero()
        progress, pace = self._begin(show_progress, run.directory, rank_zero)
        saved_at, stopping = None, None  # stopping: the stop signal all ranks agreed on
        self.checkpoints.clock.restart()
        try:
            if self.validation_due:  # one a stop cut short or skipped: first (R-EVAL-4)
                stopping = self.validation(progress, stop)
            while self.step < t.max_updates and not stopping and not self.stops_early:
                result = self._update(stop)
                self.step += 1
                # The last update's figures, on the host by now (R-GPU-1).
                stopping, save_due = self.figures.act_on_lagged(self.step - 1, pace)
                if not (stopping or save_due or self.figures.read_at_once(self.step)):
                    # Nothing of this update is read now: the host queues the next one while
                    # the device computes; every rank acts on these figures after it.
                    self.figures.lagged = result
                    progress.update(self.step)
                    continue
                now_stopping, now_due = self.figures.act_on(result, self.step, pace)
                stopping, save_due = stopping or now_stopping, save_due or now_due
                if self.step % t.log_every == 0:
                    self.figures.log(result, progress, pace)
                stopping = self._validate_if_due(progress, stop, stopping)
                if self._save_if_due(run.directory, save_due):
                    saved_at = self.step
                progress.update(self.step)
            if saved_at != self.step:
                self.save(run.directory / LAST)
            # The end, a stop signal: the snapshot is complete before anyone is told so.
            self.checkpoints.stop_if_failed(self.checkpoints.settle() if rank_zero else None,
                                            self.step)
        except DataFailure as exc:  # the data layer says what failed; we add where to go on
            self.checkpoints.settle()  # a snapshot in flight is the newest: it is named
            raise TrainingError(f"{exc}; {where_to_continue(run.directory)}") from None
        except Exception as exc:
            if not peer_gone(exc, stop, process_group.is_distributed()):
                raise
            raise stopped_without_snapshot(stop.signum, self.step, t.max_updates,
                                           run.directory, process_group.world_size(),
                                           exc) from exc
        finally:
            self.watch.end(self.step)
            progress.close()
            self.checkpoints.settle()  # every exit path waits for the save in flight
        self._end(stopping, run.directory, rank_zero)
        return dict(self.last_metrics)

    def _begin(self, show_progress: bool, directory: Path, rank_zero: bool
               ) -> tuple[ProgressReporter, DataPace]:
        """The disk plan's warning, the progress bar (a resumed one from the snapshot's last
        figures, not `-`) and the data pace."""
        t = self.config.trainer
        if rank_zero:
            warn_about_checkpoint_plan(t, self.config.optimizer.name, self.learner.model,
                                       self.step, directory)
        self.figures.lagged = None
        self.watch.begin(directory, self.step)  # the profile's window, the snapshot
        progress = ProgressReporter(t.max_updates, self.step, show_progress and rank_zero,
                                    t.log_every, label=self.best.label)
        if self.step:
            progress.update(self.step, loss=self.last_metrics.get("train/loss", float("nan")))
            self.validation.show(progress, self.last_metrics)
        return progress, DataPace(t.batch_size * t.grad_accumulation
                                  * process_group.world_size())

    def _validate_if_due(self, progress: ProgressReporter, stop: StopRequest | None,
                         stopping: int | None) -> int | None:
        """This update's validation, when due; the stop agreed. A stop agreed at the update
        skips it, so that the snapshot comes first, and one asked during it cuts it short:
        either way it stays due (R-EVAL-4)."""
        every = self.config.trainer.validate_every
        if not every or self.step % every:
            return stopping
        self.validation_due = self.validation.configured
        with self.watch.paused():  # the others may wait for rank 0's evaluation (R-OPS-1)
            return stopping or self.validation(progress, stop)

    def _save_if_due(self, directory: Path, time_due: bool) -> bool:
        """The step file of `trainer.save_every`, else last.pt when `save_every_s` elapsed
        (`time_due`: rank 0's note); whether a snapshot was saved."""
        every = self.config.trainer.save_every
        if every and self.step % every == 0:
            self.save(directory / step_filename(self.step))
        elif time_due:
            self.save(directory / LAST)
        else:
            return False
        return True

    def _end(self, stopping: int | None, directory: Path, rank_zero: bool) -> None:
        """After the loop and its last save: an early stop is recorded; a stop signal is
        recorded and raised (Stopped), also at the last update when its validation is due."""
        t = self.config.trainer
        if self.stops_early and self.step < t.max_updates and rank_zero:
            log.info("%s", record_stopped_early(directory, self.step, self.tracker,
                                                t.early_stop))
        if stopping and (self.step < t.max_updates or self.validation_due):
            record_clean_stop(directory, self.step, stopping, rank_zero)  # after settle
            raise stopped(stopping, self.step, t.max_updates, directory,
                          process_group.world_size())

    def _update(self, stop: StopRequest | None) -> UpdateResult:
        """One update on every rank; the stop flags, rank 0's note and each rank's wait for
        its data ride its all-reduce. The wait counts the update's loading wherever it
        happens: before the update, and each micro-batch read as the learner reaches it
        (under G one micro-batch is loaded at a time, inside the update)."""
        # The profile's window and an out-of-memory error's message (R-OPS-2, R-OPS-3).
        with process_group.waiting_for_others(f"the other ranks in update {self.step + 1}"), \
                self.watch.update(self.step + 1, self.run_directory):
            started = time.perf_counter()
            counts = part_counts(self.sampler, self.sampler.batches_drawn)  # a mixture's
            batches = TimedLoads(self.loader.next_update())
            before = time.perf_counter() - started
            self.watch.split.begin()
            result = self.learner.update(self.objective, batches,
                                         stop=stop.flag if stop is not None else 0.0,
                                         rank_zero_note=self.checkpoints.rank_zero_note(),
                                         data_wait=lambda: before + batches.seconds,
                                         part_counts=counts,
                                         backward_done=self.watch.split.backward_done)
            self.watch.split.end(before + batches.seconds, batches.seconds)
            return result

    @property
    def stops_early(self) -> bool:
        """Whether `trainer.early_stop` ends the run at this update (R-MET-2)."""
        early = self.config.trainer.early_stop
        return early is not None and self.tracker.exhausted(early.patience)

    def _record(self, values: Mapping[str, Any], step: int | None = None) -> None:
        values = finite_values(values)  # metrics.jsonl and checkpoints: strict JSON
        self.last_metrics.update({k: v for k, v in values.items() if not is_measured(k)})
        run = require_run(self)
        if run.metrics is not None:
            run.metrics.write({"step": self.step if step is None else step, **values})

    # -- checkpoints and lifecycle -----------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint of the current state.

        Collective: every rank must call it, except from a validation callback on rank 0,
        where it writes the state committed before validation without any collective."""
        with self.watch.paused():  # the others may wait for rank 0's writes (R-OPS-1)
            return self.checkpoints.save(self, Path(path))

    def restore(self, payload: Mapping[str, Any]) -> None:
        """Load a verified checkpoint payload; each rank takes its own saved state."""
        self.checkpoints.restore(self, payload)

    def restore_from_rank_zero(self, payload: dict[str, Any] | None) -> None:
        """Restore from a payload that rank 0 read (None on the other ranks): each rank
        receives what its strategy needs of it (collective)."""
        self.restore(self.learner.strategy.receive(payload))

    def attach(self, run: RunContext) -> None:
        self.run = run

    def close(self) -> None:
        """Release the strategy's wrappers and groups and close the metrics file (before the
        process group goes)."""
        self.checkpoints.settle()  # the writer's thread fsyncs metrics.jsonl: first
        if self.loader is not None:
            self.loader.close()  # data workers end with the run
        self.learner.release()
        if self.run is not None and self.run.metrics is not None:
            self.run.metrics.close()


__all__ = ["Evaluate", "RunContext", "SupervisedTrainer"]
