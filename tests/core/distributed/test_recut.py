"""Sharded checkpoints re-cut on load for another world size (R-ELASTIC-3, the FSDP side).

Three torchrun launches of tests/scripts/recut_shards.py (gloo CPU workers) through
`FsdpStrategy`: 2 ranks save A; 1 rank restores A (and damaged or old-format copies of it)
and saves B; 2 ranks restore B (and a copy whose shard lives on a node that is gone). Each
rank must then hold exactly its slice of the full tensors that were saved: model, Adam's
moments, EMA, with dim-0 sizes uneven over 2 ranks (5 rows: 3 + 2) and an empty chunk (1
row: 1 + 0); buffers, the optimizer's step counts and the rank's own state from old rank 0.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.checkpoint.sharded import consolidated_model, read_shard, shard_table
from tests.support import SCRIPTS, assert_ok, run_torchrun, worker_env


def launch(nproc: int, out: Path, *args: str) -> list[dict]:
    out.mkdir()
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    assert_ok(run_torchrun("--out", str(out), *args, nproc=nproc, module="recut_shards",
                           env=worker_env(PYTHONPATH=path), timeout=180))
    return [torch.load(out / f"result_{r}.pt", weights_only=True) for r in range(nproc)]


def rewrite_manifest(run: Path, change) -> None:
    """Change the manifest's payload (last.pt and its step file) and re-digest it."""
    data = read_checkpoint(run / "last.pt")
    change(data["payload"]["sharded"]["shards"])
    checkpoint = make_checkpoint(data["payload"])
    checkpoint["manifest"]["strategy"] = data["manifest"]["strategy"]
    write_checkpoint(checkpoint, run / "step_3.pt", also_as=run / "last.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("recut")
    a, b = root / "A", root / "B"
    launch(2, root / "out1", "--save", str(a))
    old, bad = shutil.copytree(a, root / "A_old"), shutil.copytree(a, root / "A_bad")
    rewrite_manifest(old, lambda shards: [(e.pop("cuts"), e.pop("file_sha256"))
                                          for e in shards.values()])
    one = bad / shard_table(read_checkpoint(bad / "last.pt"))[1]["file"]
    raw = bytearray(one.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside a tensor: it would still load
    one.write_bytes(bytes(raw))
    to_one = launch(1, root / "out2", "--restore", str(old / "last.pt"), str(bad / "last.pt"),
                    str(a / "last.pt"), "--save", str(b))
    gone = shutil.copytree(b, root / "B_gone")
    (gone / shard_table(read_checkpoint(gone / "last.pt"))[0]["file"]).unlink()
    rewrite_manifest(gone, lambda shards: shards[0].update(host="gone-host"))
    to_two = launch(2, root / "out3", "--restore", str(gone / "last.pt"), str(b / "last.pt"))
    return {"root": root, "to_one": to_one, "to_two": to_two}


def expect_slices(results: list[dict], run: Path) -> None:
    """Each new rank holds exactly its rows of every full tensor saved in `run`."""
    data = read_checkpoint(run / "last.pt")
    reference = torch.load(run / "reference.pt", weights_only=True)
    ema = consolidated_model(run / "last.pt", data, ema=True)
    first = read_shard(run, data, 0)["payload"]
    for held in results:
        held = held[str(run / "last.pt")]
        assert "error" not in held, held.get("error")
        for name, value in held["model"].items():
            if name in held["cuts"]:
                a = held["cuts"][name]["offset"]
                rows = slice(a, a + held["cuts"][name]["length"])
                assert torch.equal(value, reference["model"][name][rows]), name
                assert torch.equal(held["ema"][name], ema[name][rows]), name
            else:  # buffers: old rank 0's
                assert torch.equal(value, first["model"][name]), name
                assert torch.equal(held["ema"][name], first["ema"][name]), name
        names = list(held["cuts"])[:len(held["optimizer"])]  # Adam's index order
        assert len(held["optimizer"]) == len(reference["optimizer"]) == 6
        for index, state in held["optimizer"].items():
            cut = held["cuts"][names[index]]
            rows = slice(cut["offset"], cut["offset"] + cut["length"])
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(state[key], reference["optimizer"][index][key][rows])
            assert torch.equal(state["step"], first["optimizer"]["state"][index]["step"])
        assert held["scheduler"] == reference["scheduler"]
        assert torch.equal(held["rank_state"]["marker"], torch.tensor([0.0]))
        assert torch.equal(held["rank_state"]["rng"], first["rank_state"]["rng"])


def test_two_ranks_recut_for_one(runs: dict) -> None:
    """Catches: offsets guessed (an even split puts 5 rows as 2 + 3, not FSDP2's 3 + 2),
    a rank's optimizer moments or EMA not re-cut (left as initialised, or rows taken from
    the wrong place of an old shard), buffers or the rank's own state not old rank 0's."""
    results = runs["to_one"]
    assert [r[str(runs["root"] / "A/last.pt")]["cuts"]["0.weight"]["length"]
            for r in results] == [5]
    expect_slices(results, runs["root"] / "A")


def test_one_rank_recut_for_two_with_uneven_and_empty_chunks(runs: dict) -> None:
    """Catches: rows copied from the new rank's offset instead of the old shard's (rank 1
    would take rows 0..1 of the single old shard), or an empty chunk mishandled."""
    results = runs["to_two"]
    cuts = [r[str(runs["root"] / "B/last.pt")]["cuts"] for r in results]
    assert [c["0.weight"]["length"] for c in cuts] == [3, 2]
    assert [c["3.weight"]["length"] for c in cuts] == [1, 0]
    expect_slices(results, runs["root"] / "B")


def test_damaged_old_shard_is_refused_by_name(runs: dict) -> None:
    """A byte flipped inside a tensor of old rank 1's shard (the file still loads).
    Catches: an old shard's file digest not verified before its rows are copied."""
    held = runs["to_one"][0][str(runs["root"] / "A_bad/last.pt")]
    assert "error" in held, "the damaged shard was loaded"
    assert "shard of rank 1" in held["error"] and "corrupt" in held["error"]
    assert "rank_1.pt" in held["error"] and "Nothing was loaded" in held["error"]


def test_checkpoint_without_cuts_is_refused_for_a_recut(runs: dict) -> None:
    """A manifest as an earlier embodichain wrote it (no cuts, no file digests). Catches:
    a re-cut attempted from guessed offsets (or failing with a KeyError) instead of a
    refusal naming why and the world size that can continue it."""
    held = runs["to_one"][0][str(runs["root"] / "A_old/last.pt")]
    assert "error" in held
    assert "does not record where each shard's rows lie" in held["error"]
    assert "only on 2 rank(s)" in held["error"]


def test_unreachable_old_shard_is_refused_alike_naming_its_host(runs: dict) -> None:
    """B's only shard written on a host that is gone and absent here. Catches: the shard
    reported as merely missing (not naming that its node is not in this world)."""
    errors = [r[str(runs["root"] / "B_gone/last.pt")].get("error") for r in runs["to_two"]]
    assert errors[0] is not None and errors[0] == errors[1]
    assert "not reachable from this node" in errors[0] and "gone-host" in errors[0]
    assert "rank_0.pt" in errors[0]
