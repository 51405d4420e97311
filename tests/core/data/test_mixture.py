"""Sampling a mixture by weight (R-SCALE-3): the samplers the trainer builds for a source with
`Parts` (core/data/mixture.py), in process. Training runs over a LeRobot mixture (workers,
resume, world sizes) are in tests/models/lerobot/test_lerobot_mixture_runs.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from embodichain.core.data.mixture import (
    MixtureGlobalSampler,
    MixtureSource,
    Parts,
    WeightedReplacementSampler,
    mixture_global_sampler,
    mixture_sampler,
)
from embodichain.core.data.samplers import ReplacementSampler
from embodichain.core.data.source import TensorSource
from embodichain.core.errors import DataFormatError
from embodichain.core.training.batches import rank_sampler

THREE_TO_ONE = Parts(("a", "b"), (63, 26), (3.0, 1.0))


def _fraction_bound(n: int, p: float) -> float:
    return 5 * math.sqrt(p * (1 - p) / n)  # 5 sigma: a false failure ~ 1 in 1.7 million


def test_with_replacement_each_part_is_drawn_in_proportion_to_its_weight() -> None:
    """Catches a draw uniform over examples (A would be 63/89 = 0.71 of them, not 0.75) or
    one that ignores a part: over 400 updates of 32 on each of 2 ranks, without and with
    G, the fraction from A lies within 5 binomial sigma of 3/4, and both parts' examples
    are all reached."""
    n = 400 * 64
    for draws in ([mixture_sampler(THREE_TO_ONE, "with_replacement", 32, 0, r, 2)
                   for r in (0, 1)],
                  [mixture_global_sampler(THREE_TO_ONE, "with_replacement", 64, 0, r, 2)
                   for r in (0, 1)]):
        indices = torch.cat([s.next_indices() for _ in range(400) for s in draws])
        counts = THREE_TO_ONE.counts(indices)
        assert abs(counts[0] / n - 0.75) < _fraction_bound(n, 0.75), counts
        assert len(set(indices.tolist())) == 89


def test_the_draw_is_a_function_of_seed_rank_and_update_only() -> None:
    """Catches a draw that carries hidden state from update to update (a resumed sampler,
    restored to its position only, would draw other examples) or is the same on both
    ranks: update 7 drawn afresh at position 7 equals the 8th of a running sampler."""
    running = WeightedReplacementSampler(THREE_TO_ONE, 16, 5, 1)
    batches = [running.next_indices() for _ in range(8)]
    restored = WeightedReplacementSampler(THREE_TO_ONE, 16, 5, 1)
    restored.load_state_dict(WeightedReplacementSampler(THREE_TO_ONE, 16, 5, 1).state_dict()
                             | {"batches_drawn": 7})
    assert torch.equal(restored.next_indices(), batches[7])
    assert not torch.equal(WeightedReplacementSampler(THREE_TO_ONE, 16, 5, 0).indices_of(7),
                           batches[7])


def test_under_g_two_ranks_slice_the_one_rank_draw() -> None:
    """Catches a weighted global draw seeded by the rank or the world size: under G = 32
    the two ranks' slices, rank by rank, are the one rank's indices, update by update."""
    one = mixture_global_sampler(THREE_TO_ONE, "with_replacement", 32, 3, 0, 1)
    two = [mixture_global_sampler(THREE_TO_ONE, "with_replacement", 32, 3, r, 2)
           for r in (0, 1)]
    assert isinstance(one, MixtureGlobalSampler)
    for _ in range(5):
        assert torch.equal(one.next_indices(), torch.cat([s.next_indices() for s in two]))


def test_in_epochs_each_part_gives_its_share_of_every_epoch_as_documented() -> None:
    """Catches an epoch that visits each example once whatever the weights, and a part
    sampled with replacement inside an epoch: an epoch has 89 examples, A gives
    round(89 * 3/4) = 67 of them (up-sampled: its 63 examples once, 4 of them twice; over
    63 epochs each exactly 67 times) and B 22 (down-sampled: over 13 epochs, 286 = 11 x 26
    draws, each of its 26 examples exactly 11 times; none twice in epoch 0, all by epoch 1).
    Ranks 0 and 1 are dealt disjoint batches of the epoch, without and with G."""
    assert THREE_TO_ONE.epoch_counts() == [67, 22]
    for epoch in range(3):
        order = THREE_TO_ONE.epoch_order(0, epoch)
        assert THREE_TO_ONE.counts(order) == [67, 22]
        assert set(torch.bincount(order[order < 63]).tolist()) == {1, 2}  # 63 once, 4 twice
    a_stream = torch.cat([(lambda o: o[o < 63])(THREE_TO_ONE.epoch_order(0, e))
                          for e in range(63)])
    assert torch.bincount(a_stream).tolist() == [67] * 63
    b_stream = torch.cat([(lambda o: o[o >= 63])(THREE_TO_ONE.epoch_order(0, e))
                          for e in range(13)])
    assert torch.bincount(b_stream - 63).tolist() == [11] * 26
    assert len(set(b_stream[:22].tolist())) == 22  # epoch 0: no example of B twice
    assert set(b_stream[:44].tolist()) == set(range(63, 89))  # by epoch 1: all of them
    samplers = [mixture_sampler(THREE_TO_ONE, "epochs", 8, 0, r, 2) for r in (0, 1)]
    epoch = torch.cat([s.next_indices() for _ in range(5) for s in samplers])  # 80 of 89
    assert len(set(epoch.tolist())) == len(set(THREE_TO_ONE.epoch_order(0, 0)[:80].tolist()))
    assert torch.equal(epoch.sort().values, THREE_TO_ONE.epoch_order(0, 0)[:80].sort().values)
    draw = mixture_global_sampler(THREE_TO_ONE, "epochs", 16, 0, 0, 1)
    assert torch.equal(torch.cat([draw.next_indices() for _ in range(5)]),
                       THREE_TO_ONE.epoch_order(0, 0)[:80])


def test_a_source_without_parts_keeps_its_uniform_sampler() -> None:
    """Catches the mixture hook changing existing runs: a source that is not a mixture
    still gets the uniform sampler, drawing the indices it always drew."""
    trainer = SimpleNamespace(global_batch_size=None, sampling="with_replacement",
                              batch_size=8, grad_accumulation=1)
    config = SimpleNamespace(trainer=trainer, seed=4)
    source = TensorSource({"x": torch.arange(50.0)})
    sampler = rank_sampler(config, source)
    assert type(sampler) is ReplacementSampler
    assert torch.equal(sampler.next_indices(), ReplacementSampler(50, 8, 4, 0).next_indices())


class _Concatenated:
    def __init__(self, *parts: list[dict[str, torch.Tensor]]) -> None:
        self.examples = [e for part in parts for e in part]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.examples[i]


def test_a_mixture_source_refuses_parts_whose_dtypes_or_keys_differ() -> None:
    """Catches a MixtureSource that compares shapes only (or nothing): part b's action in
    float64 beside a's float32, the same shape, would stop the run at the first batch that
    mixes them; it is refused when the source is made, a DataFormatError (exit 2) naming the
    key, both parts and both dtypes. A key one part lacks is refused by name too."""
    a = [{"action": torch.zeros(2), "index": torch.tensor(i)} for i in range(3)]
    b = [{"action": torch.zeros(2, dtype=torch.float64), "index": torch.tensor(i)}
         for i in range(2)]
    parts = Parts(("a", "b"), (3, 2), (1.0, 1.0))
    with pytest.raises(DataFormatError, match=r"'a' and 'b' would not batch: 'action' is "
                                              r"float32 \[2\] in 'a' and float64 \[2\] in 'b'"):
        MixtureSource(_Concatenated(a, b), "mix", parts)
    lacking = [{"index": torch.tensor(i)} for i in range(2)]
    with pytest.raises(DataFormatError, match=r"part 'b' has no 'action', which part 'a'"):
        MixtureSource(_Concatenated(a, lacking), "mix", parts)
    same = [{"action": torch.ones(2), "index": torch.tensor(i)} for i in range(2)]
    assert MixtureSource(_Concatenated(a, same), "mix", parts).parts == parts
