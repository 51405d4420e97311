"""`trainer.global_batch_size: G` (R-ELASTIC-1, R-ELASTIC-2): the examples of every update,
and their augmentation, are the same on one rank (K = 2 micro-batches) and on two (K = 1),
with any number of data workers; a `DatasetSource` is loaded one micro-batch at a time; the
same world size resumes bitwise; what does not divide is refused by every rank.

The factory (tests/factories/global_recording.py) augments in `__getitem__` with torch,
`random` and NumPy, has no dropout, and records each micro-batch its objective sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.data.samplers import epoch_permutation
from tests.support import assert_ok, run_cli, run_torchrun
from tests.support.data import data_env, data_recipe
from tests.support.state_compare import assert_training_state_equal, comparable_records

RECORDING = {"factory": "global_recording:build_supervised_trainer", "trainer.batch_size": 8,
             "trainer.global_batch_size": 16, "trainer.max_updates": 10,
             "trainer.save_every": 5, "trainer.validate_every": 0, "trainer.log_every": 1,
             # 100 examples: an epoch is 6 updates of 16 (4 dropped), so 10 updates cross
             # into the middle of the second epoch.
             "data.train_size": 100, "data.val_size": 16}


def _train(tmp_path: Path, name: str, ranks: int, env: dict[str, str] | None = None,
           **changes: object) -> Path:
    run, records = tmp_path / name, tmp_path / f"{name}_records"
    records.mkdir()
    recipe = data_recipe(tmp_path / f"{name}.yaml", run, **{**RECORDING, **changes})
    args = ("train-sl", "--config", str(recipe), "--no-progress")
    env = data_env(RECORD_DIR=str(records), **(env or {}))
    assert_ok(run_torchrun(*args, env=env) if ranks == 2 else run_cli(*args, env=env))
    return run


def _updates(run: Path) -> dict[int, dict[str, list]]:
    """Each update's examples in global order: every rank's micro-batches, rank by rank,
    each rank's in the order its objective saw them."""
    records = [json.loads(line) for path in sorted(run.parent.glob(f"{run.name}_records/*"))
               for line in path.read_text().splitlines()]
    updates: dict[int, dict[str, list]] = {}
    for r in sorted(records, key=lambda r: (r["step"], r["rank"])):  # stable: call order
        update = updates.setdefault(r["step"], {"index": [], "x": []})
        update["index"] += r["index"] or []
        update["x"] += r["x"]
    return updates


def _model(run: Path) -> dict[str, torch.Tensor]:
    return read_checkpoint(run / "last.pt")["payload"]["learner"]["model"]


@pytest.mark.parametrize("sampling", ["with_replacement", "epochs"])
def test_one_and_two_ranks_train_every_update_on_the_same_examples(tmp_path: Path,
                                                                   sampling: str) -> None:
    """Catches a draw that depends on the rank or the world size (e.g. each rank drawing
    from its own stream, or a strided rather than contiguous slice), augmentation seeded by
    the rank or by the position within the rank's batch, and an epoch order dealt per rank:
    G = 16 is one rank x 2 micro-batches of 8 or two ranks x 1, and every update's 16
    indices and augmented inputs, in global order, are equal (bitwise), also with 2 data
    workers, in both samplings (epochs: the 10 updates cross into the second epoch).

    The final models agree within a relative 1e-6 per tensor: each micro-batch's gradient
    is computed from the same inputs and weights, and the runs differ only in how the two
    micro-batches' gradients and loss statistics are summed (autograd's accumulation on
    one rank, gloo's all-reduce on two): float32 sums of two addends, at most one rounding
    (~6e-8 relative) per update, compounded over 10 Adam updates. (Two addends commute, so
    today they are in fact bitwise equal; the bound does not rely on that.)"""
    one = _train(tmp_path, "one", 1, **{"trainer.sampling": sampling})
    two = _train(tmp_path, "two", 2, **{"trainer.sampling": sampling})
    workers = _train(tmp_path, "workers", 2, **{"trainer.sampling": sampling,
                                                "trainer.data_workers": 2})
    expected = _updates(one)
    assert sorted(expected) == list(range(1, 11))
    assert all(len(u["index"]) == 16 for u in expected.values())
    assert _updates(two) == expected
    assert _updates(workers) == expected
    if sampling == "epochs":  # every example at most once per epoch
        first = [i for u in range(1, 7) for i in expected[u]["index"]]
        assert len(first) == len(set(first)) == 96
        # ... and what was trained is the epoch's permutation itself, G at a time (6 updates
        # an epoch): not merely the same on both world sizes (a slice shifted by one is).
        seed = json.loads((one / "run.json").read_text())["config"]["seed"]
        for u in range(1, 11):
            epoch, b = divmod(u - 1, 6)
            assert expected[u]["index"] == \
                epoch_permutation(seed, epoch, 100)[b * 16:(b + 1) * 16].tolist(), u
    a, b = _model(one), _model(two)
    for name in a:
        assert ((a[name] - b[name]).norm() / a[name].norm()).item() <= 1e-6, name
    # Data workers change nothing at all (R-DATA-1 under G).
    assert assert_training_state_equal(two / "last.pt", workers / "last.pt") >= 4


def test_an_in_memory_source_follows_the_global_order_too(tmp_path: Path) -> None:
    """Catches the global order applied to a `DatasetSource` only: with the corpus in
    memory (a TensorSource, gathered per micro-batch), one rank and two ranks train every
    update on the same 16 inputs, in global order."""
    tensor = {"EMBODICHAIN_TEST_SOURCE": "tensor"}
    one = _updates(_train(tmp_path, "one", 1, env=tensor))
    assert sorted(one) == list(range(1, 11))
    assert _updates(_train(tmp_path, "two", 2, env=tensor)) == one


def test_same_world_size_resumes_bitwise_in_the_middle_of_updates(tmp_path: Path) -> None:
    """Catches a sampler position that counts micro-batches (or prefetched batches) instead
    of consumed updates, and a resumed global order that restarts: two ranks with K = 2
    micro-batches each (batch 4), resumed at update 5 with 2 data workers, end bitwise
    where the uninterrupted run without workers ends, with the same records."""
    changes = {"trainer.batch_size": 4, "trainer.sampling": "epochs"}
    ref = _train(tmp_path, "ref", 2, **changes)
    resumed, records = tmp_path / "resumed", tmp_path / "resumed_records"
    records.mkdir()
    recipe = data_recipe(tmp_path / "resumed.yaml", resumed,
                         **{**RECORDING, **changes, "trainer.data_workers": 2})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume",
                           str(ref / "step_5.pt"), "--no-progress",
                           env=data_env(RECORD_DIR=str(records))))
    assert assert_training_state_equal(ref / "last.pt", resumed / "last.pt") >= 4
    assert [r for r in comparable_records(resumed) if r["step"] > 5] == \
        [r for r in comparable_records(ref) if r["step"] > 5]
    assert _updates(resumed) == {u: x for u, x in _updates(ref).items() if u > 5}


@pytest.mark.parametrize("sampling", ["with_replacement", "epochs"])
def test_the_global_order_is_the_same_on_every_world_size(sampling: str) -> None:
    """Catches a draw whose update depends on the updates drawn before it on this rank (a
    generator carried from update to update, or per rank), and slices other than the
    contiguous r-th: on 1, 2 and 4 ranks, rank by rank, each update's slices put together
    are the same 24 indices (epochs: across three epochs of a 60-example corpus, 12
    dropped each), and a sampler restored from its one number continues alike."""
    from embodichain.core.data.global_order import global_sampler

    def world(size: int, updates: int = 7) -> list[torch.Tensor]:
        ranks = [global_sampler(sampling, 60, 24, 5, r, size) for r in range(size)]
        return [torch.cat([s.next_indices() for s in ranks]) for _ in range(updates)]

    one = world(1)
    for size in (2, 4):
        assert all(torch.equal(a, b) for a, b in zip(world(size), one, strict=True))
    if sampling == "epochs":
        assert len(set(torch.cat(one[:2]).tolist())) == 48
        assert not torch.equal(torch.cat(one[:2]).sort().values, torch.cat(one[2:4]).sort().values)
    later = global_sampler(sampling, 60, 24, 5, 1, 2)
    later.load_state_dict({"kind": "global", "batches_drawn": 5})
    assert torch.equal(later.next_indices(), one[5][12:])


@pytest.mark.parametrize("corpus", [60, 70])
def test_an_epoch_under_g_is_its_permutation_cut_into_slices_of_g(corpus: int) -> None:
    """Compared with the permutation itself, not one world size with another (which share
    any bug of the draw): on 1, 2 and 4 ranks, update u's slices put together are
    `epoch_permutation(seed, e)[b*G:(b+1)*G]` (e, b = divmod(u, N // G)), over three epochs;
    with N = 60 a multiple of G = 12 each epoch trains every example exactly once (with
    N = 70 the 10 left over are dropped). Catches a slice shifted by one
    (`[b*G+1:(b+1)*G+1]`: the permutation's first example never trained and, when N % G == 0,
    the epoch's last slice one short), a slice that restarts the epoch, and slices that
    overlap."""
    from embodichain.core.data.global_order import global_sampler

    g, seed = 12, 5
    per_epoch = corpus // g
    for size in (1, 2, 4):
        ranks = [global_sampler("epochs", corpus, g, seed, r, size) for r in range(size)]
        for epoch in range(3):
            permutation = epoch_permutation(seed, epoch, corpus)
            trained = []
            for b in range(per_epoch):
                update = torch.cat([s.next_indices() for s in ranks])
                assert torch.equal(update, permutation[b * g:(b + 1) * g]), (size, epoch, b)
                trained += update.tolist()
            if corpus % g == 0:
                assert sorted(trained) == list(range(corpus)), (size, epoch)
            else:
                assert sorted(trained) == sorted(permutation[:per_epoch * g].tolist())


def test_a_mixture_epoch_under_g_is_its_weighted_order_cut_into_slices_of_g() -> None:
    """The weighted epoch of a mixture under G, against the epoch's order itself
    (`Parts.epoch_order`), on 1 and 2 ranks over two epochs, 48 examples in slices of 12.
    Catches the same slice shifted by one in the mixture's draw (WeightedEpochDraw)."""
    from embodichain.core.data.mixture import Parts, mixture_global_sampler

    parts = Parts(("a", "b"), (30, 18), (3.0, 1.0))
    for size in (1, 2):
        ranks = [mixture_global_sampler(parts, "epochs", 12, 9, r, size) for r in range(size)]
        for epoch in range(2):
            order = parts.epoch_order(9, epoch)
            assert len(order) == 48
            for b in range(4):
                update = torch.cat([s.next_indices() for s in ranks])
                assert torch.equal(update, order[b * 12:(b + 1) * 12]), (size, epoch, b)


def test_a_dataset_source_is_loaded_one_micro_batch_at_a_time() -> None:
    """Catches loading a rank's whole update as one DataLoader batch under G (K-fold host
    memory): with K = 3 micro-batches of 4, reading the update's first micro-batch has
    loaded 4 examples, not 12; the three together are the rank's slice of the global draw,
    in order, and the sampler counts the update only once all three are read."""
    from embodichain.core.data.dataset_source import DatasetSource
    from embodichain.core.data.global_order import ReplacementDraw, global_sampler
    from embodichain.core.data.loader import BatchLoader

    loaded: list[int] = []

    class Counting:
        def __len__(self) -> int:
            return 50

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            loaded.append(index)
            return {"i": torch.tensor(index)}

    sampler = global_sampler("with_replacement", 50, 24, seed=3, rank=1, world_size=2)
    loader = BatchLoader(DatasetSource(Counting(), identity="counting"), sampler,
                         torch.device("cpu"), seed=3, rank=1, micro_batch_size=4)
    update = loader.next_update()
    assert len(update) == 3
    first = update[0]["i"]
    assert len(loaded) == 4 and sampler.batches_drawn == 0
    rest = [update[k]["i"] for k in (1, 2)]
    assert len(loaded) == 12 and sampler.batches_drawn == 1
    assert torch.equal(torch.cat([first, *rest]), ReplacementDraw(50, 24, 3)(0)[12:])
    loader.close()


def test_every_rank_refuses_a_global_batch_its_world_cannot_divide(tmp_path: Path) -> None:
    """Catches a world-size check made only by the self-launching command (or not at all):
    under torchrun, G = 24 with batch 8 on 2 ranks (24 / 16) is refused by each worker
    before training, naming G, the world size and the batch size, and no run starts."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **{**RECORDING,
                                                      "trainer.global_batch_size": 24})
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env=data_env(RECORD_DIR=str(tmp_path)))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "trainer.global_batch_size: 24 is not a whole multiple of world size x " \
           "batch_size = 2 x 8 = 16" in proc.stderr
    assert "exitcode  : 2" in proc.stderr or "exitcode: 2" in proc.stderr, proc.stderr
    assert not run.exists() and not list(tmp_path.glob("rank*.jsonl"))
