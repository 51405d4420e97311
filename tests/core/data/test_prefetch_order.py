"""R-GPU-2: on CUDA, in-memory batches are sent to the device one micro-batch ahead, drawn
from a look-ahead copy of the sampler (core/data/prefetch.py, loader.py). The order and the
checkpointed position must be those of the loader without prefetch: the same micro-batches,
in the same order, and the sampler's position the consumed one, also after a restore.

The device half (streams, pinned copies) needs CUDA (tests/core/training/test_host_reads.py);
here the prefetch's copy is replaced by the gather itself, so the look-ahead is what is
checked. Catches: the sampler advanced by the look-ahead (a checkpoint one update ahead),
the next update's batch drawn from the sampler rather than its copy, and a look-ahead not
restarted after the sampler is restored (the resumed run would train on stale batches).
"""

from __future__ import annotations

import torch

from embodichain.core.data import loader as loader_module
from embodichain.core.data.loader import BatchLoader
from embodichain.core.data.prefetch import PrefetchedMicroBatches
from embodichain.core.data.samplers import EpochSampler, ReplacementSampler
from embodichain.core.data.source import TensorSource

CPU = torch.device("cpu")


class _HostPrefetch:
    """DevicePrefetch's interface, without a device: `start` gathers, `take` hands over."""

    def __init__(self, gather, device) -> None:
        self._gather, self.device, self.started = gather, device, 0

    def start(self, indices):
        self.started += 1
        return self._gather(indices)

    def take(self, flight):
        return flight

    def update(self, indices, batch_size):
        return PrefetchedMicroBatches(self, indices.split(batch_size))


def _loaders(make_sampler):
    source = TensorSource({"x": torch.arange(64.0).unsqueeze(1)})
    plain = BatchLoader(source, make_sampler(), CPU, seed=0, rank=0, micro_batch_size=4)
    ahead = BatchLoader(source, make_sampler(), CPU, seed=0, rank=0, micro_batch_size=4)
    ahead._prefetch = _HostPrefetch(source.gather, CPU)
    return plain, ahead


def _xs(batches) -> list[list[float]]:
    return [b["x"].flatten().tolist() for b in batches]


def test_prefetched_batches_and_position_equal_the_plain_loader() -> None:
    for make_sampler in (lambda: EpochSampler(64, 8, 3, 0, 1),
                         lambda: ReplacementSampler(64, 8, 3, 0)):
        plain, ahead = _loaders(make_sampler)
        saved = expected = None
        for update in range(12):
            if update == 5:  # a snapshot's position, resumed from below
                state = plain.sampler.state_dict()
                saved = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in state.items()}
            batches = _xs(plain.next_update())
            if update == 5:
                expected = batches
            assert _xs(ahead.next_update()) == batches, update
            assert ahead.sampler.batches_drawn == plain.sampler.batches_drawn == update + 1
        # the next update's first micro-batch was started before it was asked for
        assert ahead._prefetch.started >= 12 * 2 + 1
        # a restore to an earlier position (a resume): the look-ahead starts again from it
        ahead.sampler.load_state_dict(saved)
        assert _xs(ahead.next_update()) == expected
        assert ahead.sampler.batches_drawn == 6


def test_the_loader_uses_the_prefetch_only_on_cuda() -> None:
    source = TensorSource({"x": torch.zeros(8, 1)})
    loader = BatchLoader(source, EpochSampler(8, 4, 0, 0, 1), CPU, seed=0, rank=0)
    assert loader._prefetch is None and loader_module.DevicePrefetch is not None
