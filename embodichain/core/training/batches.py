"""How the trainer gets its batches: the sampler `trainer.sampling` names and the loader that
`trainer.data_workers` / `trainer.prefetch` configure (data/loader.py), built for this rank."""

from __future__ import annotations

import logging

import torch

from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.global_order import global_sampler
from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.mixture import mixture_global_sampler, mixture_sampler, parts_of
from embodichain.core.data.samplers import Sampler, make_sampler
from embodichain.core.data.source import Source
from embodichain.core.distributed import process_group
from embodichain.core.errors import UsageError
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.training.model_facts import only_acting


def data_of(config: FrameworkConfig, source: Source | None, device: torch.device
            ) -> tuple[Sampler | None, BatchLoader | None]:
    """This rank's sampler and loader; none for a model rebuilt only to act (`eval`,
    `export`: whatever the world size, no data read, R-EVAL-5)."""
    if only_acting():
        return None, None
    if source is None:
        raise UsageError(f"factory {getattr(config, 'factory', '?')!r} gave no source "
                         "(source=None is for a model rebuilt to act from a checkpoint's "
                         "model_facts, never for training)")
    sampler = rank_sampler(config, source)
    return sampler, batch_loader(config, source, sampler, device)  # §11, data workers


def rank_sampler(config: FrameworkConfig, source: Source) -> Sampler:
    # An update draws all its K * batch_size indices at once (R-LOOP-1): K=4 with batch 8
    # trains on the examples K=1 with batch 32 does.
    t = config.trainer
    rank, world_size = process_group.rank(), process_group.world_size()
    # A mixture's parts are drawn by weight (R-SCALE-3); any other source as always.
    parts = parts_of(source)
    if parts is not None and parts.total != len(source):
        raise UsageError(f"the source's parts hold {parts.total} examples, the source "
                         f"{len(source)}")
    if t.global_batch_size is not None:
        # Under G the order is the world's, not the rank's (R-ELASTIC-2); a recipe loaded
        # for another world size is refused here, before training (ValueError names G).
        try:
            t.micro_batches_per_update(world_size)
        except ValueError as exc:
            raise UsageError(f"{exc}. Nothing was trained") from None
        if parts is not None:
            return mixture_global_sampler(parts, t.sampling, t.global_batch_size,
                                          config.seed, rank, world_size)
        return global_sampler(t.sampling, len(source), t.global_batch_size, config.seed,
                              rank, world_size)
    if parts is not None:
        return mixture_sampler(parts, t.sampling, t.batch_size * t.grad_accumulation,
                               config.seed, rank, world_size)
    return make_sampler(t.sampling, len(source), t.batch_size * t.grad_accumulation,
                        config.seed, rank, world_size)


def batch_loader(config: FrameworkConfig, source: Source, sampler: Sampler,
                 device: torch.device) -> BatchLoader:
    t = config.trainer
    if t.data_workers and not isinstance(source, DatasetSource) and process_group.is_rank_zero():
        # Said once, by rank 0, as the trainer is built: the key is not silently ignored.
        logging.getLogger("embodichain").warning(
            "warning: trainer.data_workers: %d has no effect: the factory's source is %s, "
            "in memory (only a DatasetSource is loaded by worker processes)",
            t.data_workers, type(source).__name__)
    return BatchLoader(source, sampler, device, seed=config.seed, rank=process_group.rank(),
                       workers=t.data_workers, prefetch=t.prefetch,
                       micro_batch_size=t.batch_size,
                       worker_timeout_s=t.collective_timeout / 2)  # named before the watch
