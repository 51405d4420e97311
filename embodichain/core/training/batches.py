"""How the trainer gets its batches: the sampler `trainer.sampling` names and the loader that
`trainer.data_workers` / `trainer.prefetch` configure (data/loader.py), built for this rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.samplers import Sampler, make_sampler
from embodichain.core.distributed import process_group as dist_utils
from embodichain.core.training.nonfinite import last_good_snapshot

if TYPE_CHECKING:
    from embodichain.core.training.trainer import SupervisedTrainer


def rank_sampler(trainer: SupervisedTrainer) -> Sampler:
    config = trainer.config
    return make_sampler(config.trainer.sampling, len(trainer.source), config.trainer.batch_size,
                        config.seed, dist_utils.rank(), dist_utils.world_size())


def batch_loader(trainer: SupervisedTrainer) -> BatchLoader:
    t = trainer.config.trainer
    return BatchLoader(trainer.source, trainer.sampler, trainer.device,
                       seed=trainer.config.seed, rank=dist_utils.rank(),
                       workers=t.data_workers, prefetch=t.prefetch,
                       # gradient accumulation, where the trainer has it: K batches an update
                       micro_batches=getattr(t, "grad_accumulation", 1),
                       where_to_continue=lambda: where_to_continue(trainer))


def where_to_continue(trainer: SupervisedTrainer) -> str:
    """Which snapshot the run can continue from, as this rank sees it."""
    run = trainer.run
    if run is None:
        return ""
    if not run.directory.is_dir():  # another node: only rank 0 sees the run directory
        return "rank 0's run directory holds the last snapshot"
    snapshot = last_good_snapshot(run.directory)
    return (f"the last snapshot is {snapshot}" if snapshot is not None
            else f"no snapshot was saved in {run.directory} yet")
