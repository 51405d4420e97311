"""SupervisedTrainer: the fit loop, validation on rank 0, and collective checkpointing."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint.disk_plan import warn_about_checkpoint_plan
from embodichain.core.checkpoint.file import (
    LAST,
    step_filename,
    step_files,
)
from embodichain.core.checkpoint.rank_state import (
    capture_buffers,
    capture_rng,
    preserved_rng,
    restore_buffers,
    restore_rng,
)
from embodichain.core.checkpoint.sharded_writer import ShardedWriter
from embodichain.core.checkpoint.writer import (
    SAVE_DUE,
    SAVE_FAILED,
    CheckpointWriter,
    SaveClock,
    SaveFailure,
    failure_reason,
    rank_zero_note,
)
from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.source import Source
from embodichain.core.distributed import process_group as dist_utils
from embodichain.core.distributed.stop_request import StopRequest, signal_of
from embodichain.core.errors import TrainingError, UsageError
from embodichain.core.observe.progress import ProgressReporter, log
from embodichain.core.recipe.best import Best, BestTracker, MetricMissing, choose_best
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.runs.best_record import record_stopped_early
from embodichain.core.runs.run_dir import MetricsWriter
from embodichain.core.training.batches import batch_loader, rank_sampler
from embodichain.core.training.callbacks import SaveBest, ValidationCallback
from embodichain.core.training.ema import validation_models
from embodichain.core.training.learner import Learner
from embodichain.core.training.micro_batches import MicroBatches, split_batch
from embodichain.core.training.nonfinite import finite_values, stop_message
from embodichain.core.training.objective import Objective
from embodichain.core.training.param_groups import ParamGroups
from embodichain.core.training.precision import Precision, trainer_precision
from embodichain.core.training.sharded_saves import restore_sharded, save_sharded
from embodichain.core.training.stops import peer_gone, stopped, stopped_without_snapshot

Evaluate = Callable[[nn.Module, torch.device], dict[str, float]]


@dataclass
class RunContext:
    """Where a run writes and who it is; `metrics` is set on rank 0 only."""

    directory: Path
    identity: dict[str, Any]  # run_id, factory, config, config_sha256, source_identity, ...
    metrics: MetricsWriter | None = None


@dataclass
class CommittedState:
    """Every rank's state after an update, gathered on rank 0 (None elsewhere)."""

    step: int
    ranks: dict[int, dict[str, Any]] | None
    extra: dict[str, Any] = field(default_factory=dict)


class SupervisedTrainer:
    """Samples batches, updates the learner, validates on rank 0 and saves checkpoints.

    A factory builds it from the validated recipe; the framework attaches a run directory
    and calls `fit()` on every rank.
    `param_groups` (optional): `[{"params", "lr_scale", "weight_decay", "name"}, ...]`,
    parameter groups with their own learning-rate scale and weight decay (R-LOOP-3; see
    core/training/param_groups.py).
    """

    def __init__(
        self,
        config: FrameworkConfig,
        *,
        model: nn.Module,
        source: Source,
        objective: Objective,
        device: torch.device,
        evaluate: Evaluate | None = None,
        callbacks: Sequence[ValidationCallback] = (),
        precision: Precision | None = None,
        param_groups: ParamGroups | None = None,
        best: Best | tuple[str, str] | None = None,
        shard_blocks: Sequence[nn.Module] = (),
    ) -> None:
        self.config = config
        self.device = device
        self.source = source
        self.objective = objective
        self.evaluate = evaluate
        self.callbacks = list(callbacks)
        # R-MET-1: the recipe's trainer.best, else the factory's `best`, else validation/mse.
        self.best = choose_best(config.trainer, best, evaluate is not None)
        self.tracker = BestTracker(self.best)
        if config.trainer.save_best and not any(isinstance(cb, SaveBest) for cb in callbacks):
            # `trainer.save_best: true`: keep best.pt by the best metric. Appended last, so
            # the factory's own callbacks keep their checkpoint keys whether or not it is on.
            self.callbacks.append(SaveBest(self.best.metric, mode=self.best.mode))
        t = config.trainer
        _check_strategy(config)
        self.learner = Learner(model, config.optimizer, config.scheduler, t.max_updates, device,
                               trainer_precision(t.precision, precision, device),
                               param_groups=param_groups, compile=t.compile,
                               ema_decay=t.ema.decay if t.ema is not None else None,
                               strategy=t.strategy, shard_blocks=shard_blocks,
                               reshard_after_forward=t.fsdp.reshard_after_forward
                               if t.fsdp is not None else True)
        # An update draws all its K * batch_size indices at once (R-LOOP-1); the sampler's
        # position is the consumed one, checkpointed.
        self.sampler = rank_sampler(config, source)
        self.loader = batch_loader(config, source, self.sampler, device,  # §11, data workers
                                   lambda: self.run.directory if self.run else None)
        self.step = 0
        self.run: RunContext | None = None
        self.last_metrics: dict[str, float] = {}
        self._committed: CommittedState | None = None  # set only while validating
        # Saves go through one writer (rank 0 writes; in the background unless async_save
        # is off), also those of validation callbacks (R-CKPT-8, R-VAL-2).
        # Sharded (trainer.strategy: fsdp), every rank writes its own shard (R-SHARD-2).
        self._saves: CheckpointWriter | ShardedWriter = (
            ShardedWriter(t.async_save) if self.learner.sharded
            else CheckpointWriter(t.async_save))
        self._deferred_saves: list[Path] = []  # sharded saves asked for during validation
        self._save_clock = SaveClock(config.trainer.save_every_s)  # R-CKPT-9, rank 0's

    @property
    def model(self) -> nn.Module:
        """The unwrapped model."""
        return self.learner.model

    @property
    def run_directory(self) -> Path:
        return self._require_run().directory

    # -- the loop ----------------------------------------------------------------------

    def fit(self, show_progress: bool = True, stop: StopRequest | None = None
            ) -> dict[str, float]:
        """Train to `trainer.max_updates`, validating, logging and saving on schedule.

        When `stop` is requested on any rank, every rank finishes the same update, saves a
        snapshot of it and raises Stopped (R-SIG-1).
        """
        t = self.config.trainer
        run = self._require_run()
        if dist_utils.is_rank_zero():
            warn_about_checkpoint_plan(t, self.config.optimizer.name, self.learner.model,
                                       self.step, run.directory)
        progress = ProgressReporter(t.max_updates, self.step,
                                    show_progress and dist_utils.is_rank_zero(), t.log_every,
                                    label=self.best.label)
        if self.step:  # resumed: the bar starts from the snapshot's last figures, not `-`
            progress.update(self.step, loss=self.last_metrics.get("train/loss", float("nan")))
            self._show_validation(progress, self.last_metrics)
        saved_at, stopping = None, None  # stopping: the stop signal all ranks agreed on
        self._save_clock.restart()
        try:
            while self.step < t.max_updates and not stopping and not self.stops_early:
                summary = self._update(stop)
                self.step += 1
                stopping = signal_of(summary["stop"])
                if summary["rank_zero_note"] >= SAVE_FAILED:  # a background save failed
                    self._stop_if_save_failed(self._saves.failure)
                self._check_finite(summary)
                if summary["skipped"]:
                    self._record({"train/skipped": 1})
                if self.step % t.log_every == 0:
                    self._log_training(summary, progress)
                if t.validate_every and self.step % t.validate_every == 0:
                    self._validate(progress)
                if t.save_every and self.step % t.save_every == 0:
                    self.save(run.directory / step_filename(self.step))
                    saved_at = self.step
                elif summary["rank_zero_note"] == SAVE_DUE:  # trainer.save_every_s elapsed
                    self.save(run.directory / LAST)
                    saved_at = self.step
                progress.update(self.step)
            if saved_at != self.step:
                self.save(run.directory / LAST)
            # The end, a stop signal: the snapshot is complete before anyone is told so.
            self._stop_if_save_failed(self._saves.settle() if dist_utils.is_rank_zero()
                                      else None)
        except Exception as exc:
            if not peer_gone(exc, stop, dist_utils.is_distributed()):
                raise
            raise stopped_without_snapshot(stop.signum, self.step, t.max_updates,
                                           run.directory, dist_utils.world_size(), exc) from exc
        finally:
            progress.close()
            self._saves.settle()  # every exit path waits for the save in flight (rank 0)
        if self.stops_early and self.step < t.max_updates and dist_utils.is_rank_zero():
            log.info("%s", record_stopped_early(run.directory, self.step, self.tracker,
                                                t.early_stop))
        if stopping and self.step < t.max_updates:
            raise stopped(stopping, self.step, t.max_updates, run.directory,
                          dist_utils.world_size())
        return dict(self.last_metrics)

    def _update(self, stop: StopRequest | None) -> dict[str, float]:
        """One update on every rank; the stop flags and rank 0's note ride its all-reduce."""
        self.learner.rank_zero_note = (rank_zero_note(self._saves, self._save_clock)
                                       if dist_utils.is_rank_zero() else 0.0)
        with dist_utils.waiting_for_others(f"the other ranks in update {self.step + 1}"):
            return self.learner.update(self.objective, self._next_batch(),
                                       stop=stop.flag if stop is not None else 0.0)

    @property
    def stops_early(self) -> bool:
        """Whether `trainer.early_stop` ends the run at this update (R-MET-2)."""
        early = self.config.trainer.early_stop
        return early is not None and self.tracker.exhausted(early.patience)

    def _next_batch(self) -> Sequence[dict[str, torch.Tensor]]:
        """The update's micro-batches (one unless `trainer.grad_accumulation`): an in-memory
        source's gathered lazily, one at a time; a `DatasetSource`'s loaded by the data
        workers as the update's whole batch, then cut in order."""
        t = self.config.trainer
        if isinstance(self.source, DatasetSource):
            return split_batch(self.loader.next_batch(), t.batch_size)
        return MicroBatches(self.sampler.next_indices(), t.batch_size, self._gather)

    def _gather(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        batch = self.source.gather(indices)
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _log_training(self, summary: Mapping[str, float], progress: ProgressReporter) -> None:
        # A skipped update (zero global weight) has no loss: the key is left out, not NaN,
        # so every line stays strict JSON.
        record = {f"train/{k}": v for k, v in summary.items()
                  if k not in ("skipped", "stop", "rank_zero_note")}
        record["train/lr"] = self.learner.lr
        record.update(self.loader.metrics())  # train/epoch with trainer.sampling: epochs
        record["time/updates_per_s"] = progress.rate(self.step)
        record["time/elapsed_s"] = progress.elapsed()
        self._record(record)
        progress.update(self.step, loss=summary.get("loss", float("nan")))

    def _check_finite(self, summary: Mapping[str, float]) -> None:
        """`trainer.on_nonfinite` after an update whose global loss was not finite (the
        learner did not apply it): `stop` raises here, on every rank at the same update."""
        if not summary.get("nonfinite"):
            return
        self._record({"train/nonfinite": 1})
        if self.config.trainer.on_nonfinite == "stop":
            self._saves.settle()  # a snapshot in flight is the last good one: it is named
            # Only rank 0 reads the run directory (R-DIST-6: no shared filesystem assumed).
            directory = self._require_run().directory if dist_utils.is_rank_zero() else None
            raise TrainingError(stop_message(self.step, summary.get("loss"), directory))

    def _record(self, values: Mapping[str, Any]) -> None:
        values = finite_values(values)  # metrics.jsonl and checkpoints: strict JSON
        self.last_metrics.update({k: v for k, v in values.items() if not k.startswith("time/")})
        run = self._require_run()
        if run.metrics is not None:
            run.metrics.write({"step": self.step, **values})

    # -- validation --------------------------------------------------------------------

    def _validate(self, progress: ProgressReporter) -> None:
        """Rank 0 evaluates the unwrapped model; callbacks may `save()` the committed state."""
        if self.evaluate is None:
            return
        self._committed = self._capture_committed()
        failure = None
        if self.learner.sharded and not dist_utils.is_rank_zero():
            self._evaluate_with_rank_zero()
        if dist_utils.is_rank_zero():
            try:
                metrics = self._evaluate()
                self._record(metrics)
                self._show_validation(progress, metrics)
                early = self.config.trainer.early_stop
                self.tracker.observe(self.step, metrics, early.min_delta if early else 0.0)
                for callback in self.callbacks:
                    callback.on_validation(self, metrics)
            except MetricMissing as exc:  # the recipe's mistake: its message, no traceback
                failure = str(exc)
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
                log.exception("validation failed at update %d", self.step)
        self._committed = None
        # Other ranks wait here; a failure on rank 0 stops every rank instead of hanging it.
        # Every rank takes rank 0's standing on the best metric: all agree on an early stop.
        outcome = self._stop_if_rank_zero_failed(
            failure, f"validation failed on rank 0 at update {self.step}",
            best_tracker=self.tracker.state_dict(),
            saves=[str(p) for p in self._deferred_saves])
        self.tracker.load_state_dict(outcome["best_tracker"])
        self._deferred_saves = []
        for path in outcome["saves"]:  # sharded: every rank writes the callbacks' saves
            self.save(Path(path))

    def _evaluate_with_rank_zero(self) -> None:
        """Sharded, the forward is collective: every rank evaluates beside rank 0 (whose
        figures count); a failure here is rank 0's to report."""
        try:
            self._evaluate()
        except Exception:
            log.debug("validation failed on rank %d at update %d", dist_utils.rank(),
                      self.step, exc_info=True)

    def _show_validation(self, progress: ProgressReporter, metrics: Mapping[str, float]
                         ) -> None:
        """The bar's validation field: the best metric's value (R-UX-1, R-MET-1), from a
        validation's metrics or, after a resume, the ones the checkpoint restored."""
        progress.update(self.step, val=metrics.get(self.best.metric))

    def _evaluate(self) -> dict[str, float]:
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        ema = self.config.trainer.ema
        for model, named in validation_models(self.learner.model, self.learner.ema,
                                              ema.validate if ema is not None else None):
            with preserved_rng(self.device), torch.no_grad():
                model.eval()
                try:
                    metrics.update(named({k: float(v) for k, v in
                                          self.evaluate(model, self.device).items()}))
                finally:
                    model.train()
        metrics["time/validation_s"] = time.perf_counter() - start
        return metrics

    # -- checkpoints -------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint of the current state.

        Collective: every rank must call it, except from a validation callback on rank 0,
        where it writes the state committed before validation without any collective.
        """
        path = Path(path)
        also_last = path.name.startswith("step_") and path.parent == self.run_directory
        if self._committed is not None and self.learner.sharded:
            self._deferred_saves.append(path)  # every rank writes it after validation
            return path
        if self._committed is not None:  # inside a validation callback, rank 0 only
            self._write(self._committed, path, also_last)
            return path
        if self.learner.sharded:
            self._stop_if_save_failed(save_sharded(self, path, also_last))
            if also_last or path.name == LAST:
                self._save_clock.restart()
            return path
        # One save in flight at most: rank 0 first waits for the previous one (the others
        # wait in the capture's gather), which may have failed.
        failure = self._saves.settle() if dist_utils.is_rank_zero() else None
        committed = self._capture_committed()
        if dist_utils.is_rank_zero() and failure is None:
            try:
                self._write(committed, path, also_last)
            except Exception as exc:  # every rank must hear of it, or the others would hang
                failure = SaveFailure(path, failure_reason(exc, path))
        self._stop_if_save_failed(failure)
        if also_last or path.name == LAST:
            self._save_clock.restart()
        return path

    def _stop_if_save_failed(self, failure: SaveFailure | None) -> None:
        """Every rank stops, naming the file and the reason, when a save failed on rank 0."""
        self._stop_if_rank_zero_failed(failure.reason if failure else None,
                                       failure.what if failure else "")

    def _stop_if_rank_zero_failed(self, failure: str | None, what: str, **shared: Any
                                  ) -> dict[str, Any]:
        """Every rank learns whether rank 0 failed; if so, every rank raises TrainingError
        (with rank 0's `what`: only rank 0 may know which file failed). `shared`: rank 0's
        values that ride along, returned in the outcome."""
        mine = {"failure": failure, "what": what, **dist_utils.rank_zero_origin(), **shared}
        with dist_utils.waiting_for_others(f"rank 0 at update {self.step}", on_rank_zero=True):
            outcome = dist_utils.broadcast_from_rank_zero(mine if dist_utils.is_rank_zero()
                                                          else None)
        if outcome["failure"]:
            dist_utils.wait_for_rank_zero_exit(outcome)
            raise TrainingError(f"{outcome['what']}: {outcome['failure']}")
        return outcome

    def _capture_committed(self) -> CommittedState:
        own = {"rng": capture_rng(self.device), "sampler": self.sampler.state_dict(),
               "buffers": capture_buffers(self.learner.model)}
        with dist_utils.waiting_for_others(f"the state of update {self.step}", on_rank_zero=True):
            gathered = dist_utils.gather_to_rank_zero(own)
        ranks = dict(enumerate(gathered)) if gathered is not None else None
        return CommittedState(self.step, ranks)

    def _write(self, committed: CommittedState, path: Path, also_last: bool) -> None:
        run = self._require_run()
        payload = {
            "run": {**run.identity, "step": committed.step, "metrics": dict(self.last_metrics),
                    "best_tracker": self.tracker.state_dict()},
            "learner": self.learner.state_dict(),
            "ranks": committed.ranks,
            "callbacks": {key: cb.state_dict() for key, cb in self._keyed_callbacks()
                          if hasattr(cb, "state_dict")},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        metrics = run.metrics  # durable up to this step before the snapshot is published;
        durable = (None if metrics is None  # from the writer's thread: fsync, never write
                   else metrics.fsync if self._saves.background else metrics.sync)
        self._saves.write(payload, path, also_as=path.parent / LAST if also_last else None,
                          before_publish=durable,
                          after_publish=(lambda: self._apply_retention(path.parent))
                          if also_last else None)

    def _keyed_callbacks(self) -> list[tuple[str, Any]]:
        """Callbacks under checkpoint keys `"{index}:{class}"`: a callback's state only ever
        goes back to a callback of the same kind at the same position."""
        return [(f"{i}:{type(cb).__qualname__}", cb) for i, cb in enumerate(self.callbacks)]

    def _apply_retention(self, directory: Path) -> None:
        keep = self.config.trainer.keep_last
        if keep is None:
            return
        for _, old in step_files(directory)[:-keep]:
            old.unlink(missing_ok=True)

    def restore(self, payload: Mapping[str, Any]) -> None:
        """Load a verified checkpoint payload; each rank takes its own saved state."""
        if self.learner.sharded or "sharded" in payload:
            restore_sharded(self, payload)  # refuses a checkpoint of the other strategy
            return
        ranks = payload["ranks"]
        mine = ranks[dist_utils.rank()]
        self.learner.load_state_dict(payload["learner"])
        self.sampler.load_state_dict(mine["sampler"])
        restore_buffers(self.learner.model, mine["buffers"])
        restore_rng(mine["rng"], self.device)
        self._restore_common(payload)

    def _restore_common(self, payload: Mapping[str, Any]) -> None:
        """Callbacks, step, metrics and best metric: the same for every rank."""
        saved = payload.get("callbacks") or {}
        for key, callback in self._keyed_callbacks():
            state = saved.get(key)
            if state is not None and hasattr(callback, "load_state_dict"):
                callback.load_state_dict(state)
        self.step = int(payload["run"]["step"])
        self.last_metrics = dict(payload["run"].get("metrics") or {})
        self.tracker.load_state_dict(payload["run"].get("best_tracker"))

    # -- lifecycle ---------------------------------------------------------------------

    def attach(self, run: RunContext) -> None:
        self.run = run

    def close(self) -> None:
        """Release the DDP wrapper and close the metrics file (before the group goes)."""
        self._saves.settle()  # the writer's thread fsyncs metrics.jsonl: it finishes first
        self.loader.close()  # data workers end with the run
        if isinstance(self._saves, ShardedWriter):
            self._saves.release()  # its group goes before the default one
        self.learner.release()
        if self.run is not None and self.run.metrics is not None:
            self.run.metrics.close()

    def _require_run(self) -> RunContext:
        if self.run is None:
            raise RuntimeError("no run directory attached; launch through `embodichain "
                               "train-sl` or call trainer.attach(...) first")
        return self.run



def _check_strategy(config: FrameworkConfig) -> None:
    """What `trainer.strategy: fsdp` cannot be combined with yet (refused, exit 2)."""
    t = config.trainer
    if t.strategy != "fsdp":
        return
    if t.precision == "fp16":
        raise UsageError("trainer.precision: fp16 is not available with trainer.strategy: "
                         "fsdp (its gradient scaler is not sharded); use bf16 or fp32")
    if t.compile:
        raise UsageError("trainer.compile: true is not available with trainer.strategy: fsdp "
                         "yet; set trainer.compile: false")
