"""How the trainer gets its batches: the sampler `trainer.sampling` names and the loader that
`trainer.data_workers` / `trainer.prefetch` configure (data/loader.py), built for this rank."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.samplers import Sampler, make_sampler
from embodichain.core.data.source import Source
from embodichain.core.distributed import process_group as dist_utils
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.training.nonfinite import last_good_snapshot


def rank_sampler(config: FrameworkConfig, source: Source) -> Sampler:
    # An update draws all its K * batch_size indices at once (R-LOOP-1): K=4 with batch 8
    # trains on the examples K=1 with batch 32 does.
    t = config.trainer
    return make_sampler(t.sampling, len(source), t.batch_size * t.grad_accumulation,
                        config.seed, dist_utils.rank(), dist_utils.world_size())


def batch_loader(config: FrameworkConfig, source: Source, sampler: Sampler,
                 device: torch.device, run_directory: Callable[[], Path | None]
                 ) -> BatchLoader:
    """`run_directory()`: the attached run's directory (None before one is attached)."""
    t = config.trainer
    if t.data_workers and not isinstance(source, DatasetSource) and dist_utils.is_rank_zero():
        # Said once, by rank 0, as the trainer is built: the key is not silently ignored.
        logging.getLogger("embodichain").warning(
            "warning: trainer.data_workers: %d has no effect: the factory's source is %s, "
            "in memory (only a DatasetSource is loaded by worker processes)",
            t.data_workers, type(source).__name__)
    return BatchLoader(source, sampler, device, seed=config.seed, rank=dist_utils.rank(),
                       workers=t.data_workers, prefetch=t.prefetch,
                       where_to_continue=lambda: where_to_continue(run_directory()))


def where_to_continue(directory: Path | None) -> str:
    """Which snapshot the run can continue from, as this rank sees it."""
    if directory is None:
        return ""
    if not directory.is_dir():  # another node: only rank 0 sees the run directory
        return "rank 0's run directory holds the last snapshot"
    snapshot = last_good_snapshot(directory)
    return (f"the last snapshot is {snapshot}" if snapshot is not None
            else f"no snapshot was saved in {directory} yet")
