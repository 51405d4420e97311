"""BatchLoader and DatasetSource in one process: seeded examples, streams left alone, the
consumed position, failures, file digests (R-DATA-1..4)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy
import pytest
import torch

from embodichain.core.data.dataset_source import DatasetSource, file_digest
from embodichain.core.data.loader import BatchLoader, example_seed
from embodichain.core.data.samplers import ReplacementSampler
from embodichain.core.data.source import TensorSource
from embodichain.core.errors import DataFailure
from tests.factories.augmenting import AugmentingDataset

CPU = torch.device("cpu")


def _corpus(n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(n, 4, generator=g), "y": torch.randn(n, 2, generator=g),
            "mask": torch.ones(n, 2)}


def _loader(dataset, workers: int = 0, prefetch: int = 2, batch: int = 8, fail=None,
            **kwargs) -> BatchLoader:
    source = DatasetSource(dataset, identity="test")
    return BatchLoader(source, ReplacementSampler(len(dataset), batch, 7, 0), CPU, seed=7,
                       rank=0, workers=workers, prefetch=prefetch, **kwargs)


def _batches(loader: BatchLoader, n: int) -> list[dict[str, torch.Tensor]]:
    try:
        return [loader.next_batch() for _ in range(n)]
    finally:
        loader.close()


def test_in_process_loading_leaves_the_training_streams_alone() -> None:
    """Catches loading with data_workers 0 that draws from (or reseeds) the trainer's torch,
    Python or NumPy stream: dropout would then depend on the worker count."""
    torch.manual_seed(1), random.seed(1), numpy.random.seed(1)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(1), random.seed(1), numpy.random.seed(1)
    batches = _batches(_loader(AugmentingDataset(_corpus(), True, None)), 3)
    assert (torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
            and numpy.random.rand() == expected[2])
    assert not torch.equal(batches[0]["x"], batches[1]["x"])


def test_examples_are_seeded_by_their_place_not_by_the_worker() -> None:
    """Catches augmentation seeded per worker process (the DataLoader default): two workers
    and prefetch 4 must give the very batches that loading in-process gives."""
    dataset = AugmentingDataset(_corpus(), True, None)
    here = _batches(_loader(dataset), 6)
    there = _batches(_loader(dataset, workers=2, prefetch=4), 6)
    for a, b in zip(here, there, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    raw = _batches(_loader(AugmentingDataset(_corpus(), False, None)), 1)[0]
    assert not torch.equal(raw["x"], here[0]["x"])  # the augmentation is real
    assert example_seed(0, 0, 1, 2) != example_seed(0, 1, 1, 2) != example_seed(0, 0, 2, 1)


def test_without_augmentation_a_dataset_gives_the_in_memory_batches() -> None:
    """Catches a DatasetSource that loads other indices (or in another order) than the
    sampler's: its batches must equal TensorSource.gather of the same indices."""
    corpus = _corpus()
    loaded = _batches(_loader(AugmentingDataset(corpus, False, None), workers=2), 5)
    sampler = ReplacementSampler(64, 8, 7, 0)
    for batch in loaded:
        expected = TensorSource(corpus).gather(sampler.next_indices())
        assert all(torch.equal(batch[k], expected[k]) for k in expected)


def test_the_sampler_holds_the_consumed_position_not_the_prefetched_one() -> None:
    """Catches a checkpoint of the look-ahead position: with 2 workers x prefetch 4, eight
    batches are in flight, yet after 3 batches the sampler has drawn 3."""
    loader = _loader(AugmentingDataset(_corpus(), True, None), workers=2, prefetch=4)
    try:
        first = [loader.next_batch() for _ in range(3)]
        assert loader.sampler.batches_drawn == 3
        state = loader.sampler.state_dict()
    finally:
        loader.close()
    resumed = _loader(AugmentingDataset(_corpus(), True, None), workers=1)
    resumed.sampler.load_state_dict(state)
    whole = _batches(_loader(AugmentingDataset(_corpus(), True, None)), 5)
    rest = _batches(resumed, 2)
    for a, b in zip(first + rest, whole, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_failing_example_is_named_with_the_datasets_message(workers: int) -> None:
    """Catches a failure reported as a bare DataLoader traceback, without the index."""
    loader = _loader(AugmentingDataset(_corpus(), True, 5), workers=workers, batch=32)
    with pytest.raises(DataFailure) as caught:
        _batches(loader, 20)
    message = str(caught.value)
    assert "loading example 5 failed" in message
    assert "ValueError: corrupt record 5 (test)" in message
    assert "update " in message  # the trainer adds the snapshot to continue from


def test_a_dataset_source_needs_an_identity() -> None:
    """Catches a DatasetSource without a content identity (a changed dataset would resume)."""
    with pytest.raises(ValueError, match="identity"):
        DatasetSource(AugmentingDataset(_corpus(), False, None), identity="")


def test_a_file_digest_follows_the_content(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an identity from the path or time alone, and a stale cache after a change."""
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    data = tmp_path / "data.bin"
    data.write_bytes(b"a" * 1000)
    first = file_digest(data)
    assert first.startswith("sha256:")
    other = tmp_path / "other.bin"
    other.write_bytes(b"a" * 1000)
    assert file_digest(other) == first  # same bytes, another path: same identity
    data.write_bytes(b"b" * 1001)
    assert file_digest(data) != first
