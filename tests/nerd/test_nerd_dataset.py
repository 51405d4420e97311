"""NeRD data preparation: reproducible files, safe memory-mapped loading, window source."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from embodichain_models.dynamics.nerd.data import WindowSource, normalization_stats
from embodichain_models.dynamics.nerd.model import state_delta
from embodichain_models.dynamics.nerd.prepare import build_split, load_split, main

SMALL = ["--train-trajectories", "12", "--val-trajectories", "4", "--steps", "15"]


def prepare(out: Path, *extra: str) -> None:
    assert main(["--out", str(out), *SMALL, *extra]) == 0


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    prepare(tmp_path / "a")
    prepare(tmp_path / "b")
    for name in ("train.pt", "val.pt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["train.pt", "val.pt"]


def test_different_seed_gives_different_data(tmp_path: Path) -> None:
    prepare(tmp_path / "a")
    prepare(tmp_path / "b", "--seed", "1")
    a, b = load_split(tmp_path / "a" / "train.pt"), load_split(tmp_path / "b" / "train.pt")
    assert not torch.equal(a["states"], b["states"])
    assert not torch.equal(a["actions"], b["actions"])
    # The validation split has its own seed and is untouched.
    va, vb = load_split(tmp_path / "a" / "val.pt"), load_split(tmp_path / "b" / "val.pt")
    assert torch.equal(va["states"], vb["states"])


def test_split_loads_memory_mapped_without_unpickling_code(tmp_path: Path) -> None:
    prepare(tmp_path)
    data = torch.load(tmp_path / "train.pt", mmap=True, weights_only=True)
    assert data["states"].shape == (12, 16, 4) and data["states"].dtype == torch.float32
    assert data["actions"].shape == (12, 15, 2) and data["actions"].dtype == torch.float32
    assert data["physics"]["substeps"] == 5 and data["seed"] == 0
    theta = data["states"][..., 1]
    assert (theta >= -math.pi).all() and (theta < math.pi).all()
    assert (data["actions"][..., 0].abs() <= 1500).all() and (data["actions"][..., 1] == 0).all()
    val = load_split(tmp_path / "val.pt")
    assert val["seed"] == 10 and val["states"].shape == (4, 16, 4)


def test_non_finite_trajectories_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    import embodichain_models.dynamics.nerd.prepare as prep

    real = prep.random_trajectories

    def poisoned(*args, **kwargs):
        states, actions = real(*args, **kwargs)
        states[1, 5, 2] = float("nan")
        return states, actions

    monkeypatch.setattr(prep, "random_trajectories", poisoned)
    split = build_split(4, 10, seed=0)
    assert split["states"].shape[0] == 3 and split["dropped_trajectories"] == 1
    assert split["states"].isfinite().all()


def test_window_source_gathers_consistent_windows() -> None:
    split = build_split(3, 12, seed=0)
    states, actions = split["states"], split["actions"]
    source = WindowSource(states, actions, window=5, identity="test")
    assert len(source) == 3 * (12 - 5 + 1)
    batch = source.gather(torch.tensor([0, 8, 23]))
    assert batch["states"].shape == (3, 5, 4) and batch["actions"].shape == (3, 5, 2)
    # Example 8 is trajectory 1 from frame 0; example 23 trajectory 2 from frame 7.
    torch.testing.assert_close(batch["states"][1], states[1, 0:5])
    torch.testing.assert_close(batch["actions"][2], actions[2, 7:12])
    torch.testing.assert_close(batch["deltas"][2], state_delta(states[2, 7:13]))
    assert batch["deltas"][..., 1].abs().max() < math.pi  # θ differences are wrapped


def test_normalization_stats_are_per_dimension() -> None:
    split = build_split(20, 30, seed=0)
    stats = normalization_stats(split["states"], split["actions"])
    assert stats["input_mean"].shape == (6,) and stats["target_var"].shape == (4,)
    assert stats["input_var"][4] > 1e5  # force: uniform in ±1500 N, variance 750k
    assert stats["input_var"][5] == 0  # the pole torque is always zero
    # Chunked two-pass statistics equal the direct ones.
    states64 = split["states"].double()
    inputs = torch.cat((states64[:, :-1], split["actions"].double()), -1).flatten(0, 1)
    targets = state_delta(states64).flatten(0, 1)
    small_chunks = normalization_stats(split["states"], split["actions"], chunk=3)
    for name, direct in (("input_mean", inputs.mean(0)), ("input_var", inputs.var(0, correction=0)),
                         ("target_mean", targets.mean(0)),
                         ("target_var", targets.var(0, correction=0))):
        torch.testing.assert_close(stats[name], direct)
        torch.testing.assert_close(small_chunks[name], direct)
