"""FSDP2 sharding (R-SHARD-1) and sharded checkpoint files (R-SHARD-2..4), below the trainer.

One torchrun launch (tests/scripts/sharded_modules.py, 2 gloo workers) trains a small MLP
with uneven dim-0 shards sharded and replicated, saves a sharded checkpoint in the
background and restores it; the checks read what it wrote. The file-level refusals (a
damaged, missing or foreign shard; another strategy or world size) run in this process on
copies of that checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.checkpoint.sharded import (
    check_compatible,
    check_shard,
    consolidated_model,
    read_shard,
    shard_table,
)
from embodichain.core.errors import CheckpointCorruptError, CheckpointError
from tests.support import SCRIPTS, assert_ok, run_torchrun, worker_env


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sharded_modules")
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    assert_ok(run_torchrun(str(out), module="sharded_modules", env=worker_env(PYTHONPATH=path),
                           timeout=180))
    return out


def results(out: Path) -> list[dict]:
    return [torch.load(out / f"result_{r}.pt", weights_only=True) for r in range(2)]


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_sharded_update_equals_the_replicated_weighted_update(launched: Path) -> None:
    """Catches: AVG instead of SUM (the weights r + 1 and a zero-weight rank make it differ),
    no division by the global weight, or a step on a zero global weight. Tolerance: the
    sums and the clipping norm are reduced in another order (1e-7 seen)."""
    for result in results(launched):
        for name, plain in result["plain"].items():
            sharded = result["sharded_full"][name]
            assert (sharded - plain).abs().max() <= 1e-5 * plain.abs().max(), name


def test_restored_shards_continue_bitwise(launched: Path) -> None:
    """Catches: optimizer state not restored as shards of the parameter (Adam's moments),
    or a shard loaded into the wrong rank."""
    for result in results(launched):
        assert result["resumed"].keys() == result["after_20"].keys()
        for name, value in result["after_20"].items():
            assert torch.equal(value, result["resumed"][name]), name


def test_consolidated_export_has_the_full_shapes(launched: Path) -> None:
    """Catches: shards concatenated out of rank order or the uneven last shard lost."""
    data = read_checkpoint(launched / "last.pt")
    full = consolidated_model(launched / "last.pt", data)
    assert {k: tuple(v.shape) for k, v in full.items()} == {
        "0.weight": (33, 4), "0.bias": (33,), "2.weight": (2, 33), "2.bias": (2,)}
    for rank in range(2):
        shard = read_shard(launched, data, rank)["payload"]["model"]
        assert shard["0.weight"].shape[0] == (17 if rank == 0 else 16)
    rows = torch.cat([read_shard(launched, data, r)["payload"]["model"]["0.weight"]
                      for r in range(2)])
    assert torch.equal(full["0.weight"], rows)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_shard_is_refused_by_name(launched: Path, tmp_path: Path) -> None:
    """Catches: a manifest accepted without checking its shards exist."""
    run = copy_run(launched, tmp_path / "run")
    data = read_checkpoint(run / "last.pt")
    shard = run / shard_table(data)[1]["file"]
    shard.unlink()
    problem = check_shard(run, data, 1)
    assert problem is not None and "rank 1 is missing" in problem and shard.name in problem
    assert check_shard(run, data, 0) is None
    with pytest.raises(CheckpointError, match="rank 1 is missing"):
        consolidated_model(run / "last.pt", data)


def test_damaged_or_foreign_shard_is_refused_by_name(launched: Path, tmp_path: Path) -> None:
    """Catches: a shard's bytes not verified, or a verifying shard of another save taken."""
    run = copy_run(launched, tmp_path / "run")
    data = read_checkpoint(run / "last.pt")
    table = shard_table(data)
    one = run / table[1]["file"]
    raw = bytearray(one.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    one.write_bytes(bytes(raw))
    problem = check_shard(run, data, 1)
    assert problem is not None and one.name in problem and "corrupt" in problem
    # rank 0's (valid) shard in rank 1's place: it verifies on its own, not against the table
    shutil.copy(run / table[0]["file"], one)
    with pytest.raises(CheckpointCorruptError, match="rank 1 .*manifest's digest"):
        read_shard(run, data, 1)


def test_altered_and_redigested_shard_is_refused_by_the_manifests_digest(
        launched: Path, tmp_path: Path) -> None:
    """Rank 1's own shard (same step, run, config and rank) with one weight changed and
    rewritten whole, its embedded digest recomputed: it verifies on its own and passes
    every identity check, so only the digest the manifest recorded for it tells. Catches:
    the manifest's digest of a shard not compared on load (the shard would be loaded)."""
    run = copy_run(launched, tmp_path / "run")
    data = read_checkpoint(run / "last.pt")
    path = run / shard_table(data)[1]["file"]
    payload = read_checkpoint(path)["payload"]
    payload["model"]["0.weight"][0, 0] += 1.0
    write_checkpoint(make_checkpoint(payload), path)
    assert read_checkpoint(path)["payload"]["run"]["rank"] == 1  # self-consistent
    with pytest.raises(CheckpointCorruptError,
                       match=r"shard of rank 1 .*does not match the manifest's digest"):
        read_shard(run, data, 1)
    with pytest.raises(CheckpointCorruptError, match="manifest's digest"):
        consolidated_model(run / "last.pt", data)


def test_other_strategy_or_world_size_is_refused_by_name(launched: Path) -> None:
    """Catches: a sharded checkpoint restored under ddp, or at another world size."""
    data = read_checkpoint(launched / "last.pt")
    check_compatible(data, "last.pt", "fsdp", 2)
    with pytest.raises(CheckpointError, match="trainer.strategy: checkpoint fsdp, this run ddp"):
        check_compatible(data, "last.pt", "ddp", 2)
    with pytest.raises(CheckpointError, match="world size: checkpoint 2, this run 4"):
        check_compatible(data, "last.pt", "fsdp", 4)
