"""What an update's figures ask of the trainer: read at once (logged, validated, saved, the
last update) or during the next update (R-GPU-1), they count the data wait, raise a failed
background save or a non-finite loss (`trainer.on_nonfinite: stop`), record a skip, and are
logged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from embodichain.core.checkpoint.writer import SAVE_DUE, SAVE_FAILED
from embodichain.core.data.mixture import part_metrics
from embodichain.core.distributed import process_group
from embodichain.core.distributed.stop_request import signal_of
from embodichain.core.errors import TrainingError
from embodichain.core.observe.pace import DataPace
from embodichain.core.observe.progress import ProgressReporter
from embodichain.core.training.checkpointing import require_run
from embodichain.core.training.learner import UpdateResult
from embodichain.core.training.memory import peak_metrics
from embodichain.core.training.nonfinite import stop_message

Record = Callable[..., None]  # (values, step=None): a metrics line


class Trained(Protocol):
    config: Any
    checkpoints: Any
    learner: Any
    loader: Any
    sampler: Any
    step: int
    watch: Any


class UpdateFigures:
    """Acts on an update's figures for `trainer`, writing its lines through `record`."""

    def __init__(self, trainer: Trained, record: Record) -> None:
        self.trainer, self.record = trainer, record
        self.lagged: UpdateResult | None = None  # an update's figures, read after the next

    def act_on_lagged(self, step: int, pace: DataPace) -> tuple[int | None, bool]:
        """`act_on` the lagged figures of update `step`, if any (then none are lagged)."""
        lagged, self.lagged = self.lagged, None
        return self.act_on(lagged, step, pace) if lagged is not None else (None, False)

    def read_at_once(self, step: int) -> bool:
        """Whether update `step` is read at once: it is logged, validated or saved, or it is
        the last."""
        t = self.trainer.config.trainer
        return (step % t.log_every == 0 or step == t.max_updates
                or bool(t.validate_every and step % t.validate_every == 0)
                or bool(t.save_every and step % t.save_every == 0))

    def act_on(self, result: UpdateResult, step: int, pace: DataPace
               ) -> tuple[int | None, bool]:
        """What update `step`'s figures ask for: its data wait counted, a failed background
        save or (on_nonfinite: stop) a non-finite loss raised, a skip recorded; whether to
        stop (the signal every rank agreed on) and whether a time-based save is due."""
        checkpoints = self.trainer.checkpoints
        pace.add(result.data_waits, process_group.rank())
        if result.rank_zero_note >= SAVE_FAILED:  # a background save failed
            checkpoints.stop_if_failed(checkpoints.writer.failure, step)
        self.check_finite(result, step)
        if result.skipped:
            self.record({"train/skipped": 1}, step)
        return signal_of(result.stop), result.rank_zero_note == SAVE_DUE

    def check_finite(self, result: UpdateResult, step: int) -> None:
        """`trainer.on_nonfinite` after update `step`, whose global loss was not finite (the
        learner did not apply it): `stop` raises here, on every rank at the same update."""
        if not result.nonfinite:
            return
        self.record({"train/nonfinite": 1}, step)
        if self.trainer.config.trainer.on_nonfinite == "stop":
            self.trainer.checkpoints.settle()  # a snapshot in flight is the last good one
            # Only rank 0 reads the run directory (R-DIST-6: no shared filesystem assumed).
            directory = (require_run(self.trainer).directory if process_group.is_rank_zero()
                         else None)
            raise TrainingError(stop_message(step, result.loss, directory))

    def log(self, result: UpdateResult, progress: ProgressReporter, pace: DataPace) -> None:
        """The training line of the present update, and the bar's figures."""
        trainer = self.trainer
        # A skipped update (zero global weight) has no loss: the key is left out, not NaN,
        # so every line stays strict JSON.
        record: dict[str, Any] = {"train/weight": result.weight,
                                  **{f"train/{k}": v for k, v in result.metrics.items()},
                                  **({"train/nonfinite": 1.0} if result.nonfinite else {})}
        record["train/lr"] = trainer.learner.lr
        record.update(trainer.loader.metrics())  # train/epoch with trainer.sampling: epochs
        record.update(part_metrics(trainer.sampler, result.part_counts))  # a mixture's parts
        record["time/updates_per_s"] = progress.rate(trainer.step)
        record["time/elapsed_s"] = progress.elapsed()
        record.update(pace.metrics())
        record.update(trainer.watch.split.metrics())  # where the time went (R-OPS-2)
        record.update(peak_metrics(result.memory_peaks))  # every rank's (R-OPS-3)
        self.record(record)
        progress.update(trainer.step, loss=result.loss if result.loss is not None
                        else float("nan"), examples_per_s=record["time/examples_per_s"],
                        data_wait=record["time/data_wait_max"])

