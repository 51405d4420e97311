"""`trainer.sampling: epochs` (R-DATA-5): every example once per epoch across the ranks, the
remainder dropped, `train/epoch` recorded, exact resume from the middle of an epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodichain.core.data.samplers import EpochSampler, epoch_permutation
from tests.support import assert_ok, run_torchrun
from tests.support.data import data_env, data_recipe
from tests.support.state_compare import assert_training_state_equal, comparable_records


def test_each_epoch_deals_every_example_once_across_the_ranks() -> None:
    """Catches ranks that draw overlapping slices, an epoch that repeats its permutation,
    and a remainder that leaks into the next epoch."""
    size, batch, world = 1000, 32, 2  # 15 global batches an epoch, 40 examples dropped
    ranks = [EpochSampler(size, batch, 0, r, world) for r in range(world)]
    epochs = []
    for _ in range(3):
        seen = torch.cat([s.next_indices() for _ in range(15) for s in ranks])
        assert len(seen) == len(set(seen.tolist())) == 960
        epochs.append(seen)
    assert not torch.equal(epochs[0], epochs[1])
    assert ranks[0].epoch == 2 and ranks[1].batches_drawn == 45


def test_an_epoch_is_its_permutation_dealt_in_turn_to_the_ranks() -> None:
    """Against the permutation itself: batch b of rank r is `epoch_permutation(seed, e)` at
    `(b * world + r) * batch` onwards, and with a corpus that is a whole number of global
    batches (960 = 15 x 2 x 32) each epoch trains every example exactly once. Catches a
    slice shifted by one (the permutation's first example never trained, the epoch's last
    batch one short), which distinct-slices checks alone let through."""
    size, batch, world = 960, 32, 2
    ranks = [EpochSampler(size, batch, 3, r, world) for r in range(world)]
    for epoch in range(2):
        permutation = epoch_permutation(3, epoch, size)
        trained = []
        for b in range(15):
            for r, sampler in enumerate(ranks):
                start = (b * world + r) * batch
                drawn = sampler.next_indices()
                assert torch.equal(drawn, permutation[start:start + batch]), (epoch, b, r)
                trained += drawn.tolist()
        assert sorted(trained) == list(range(size)), epoch


@pytest.mark.slow
def test_epoch_resume_from_the_middle_of_an_epoch_is_exact(tmp_path: Path) -> None:
    """Catches an epoch sampler that restarts its epoch (or reshuffles) on resume, or whose
    position counts batches prefetched by the workers: resuming at update 20 (an epoch is
    15 updates) with 2 data workers equals the run without workers, bitwise."""
    recipe = {"trainer.sampling": "epochs", "data.train_size": 1000, "trainer.max_updates": 40}
    ref = tmp_path / "ref"
    assert_ok(run_torchrun("train-sl", "--config",
                           str(data_recipe(tmp_path / "ref.yaml", ref, **recipe)),
                           "--no-progress", env=data_env()))
    resumed = tmp_path / "resumed"
    config = data_recipe(tmp_path / "resumed.yaml", resumed, **recipe,
                         **{"trainer.data_workers": 2})
    assert_ok(run_torchrun("train-sl", "--config", str(config), "--resume",
                           str(ref / "step_20.pt"), "--no-progress", env=data_env()))
    assert assert_training_state_equal(ref / "last.pt", resumed / "last.pt") >= 6
    records = comparable_records(ref)
    assert [r for r in comparable_records(resumed) if r["step"] > 20] == \
        [r for r in records if r["step"] > 20]
    epochs = {r["step"]: r["train/epoch"] for r in records if "train/epoch" in r}
    assert epochs[5] == 0 and epochs[15] == 0 and epochs[20] == 1 and epochs[40] == 2


def test_a_corpus_smaller_than_a_global_batch_is_refused() -> None:
    """Catches an epoch sampler that would loop forever on empty epochs (or index past the
    corpus) when it cannot fill one global batch."""
    import pytest

    from embodichain.core.errors import UsageError

    with pytest.raises(UsageError, match=r"32 x 2 = 64 examples, the corpus has 50"):
        EpochSampler(50, 32, 0, 0, 2)
