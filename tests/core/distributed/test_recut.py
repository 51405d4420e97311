"""Sharded checkpoints re-cut on load for another world size (R-ELASTIC-3, the FSDP side).

Four torchrun launches of tests/scripts/recut_shards.py (gloo CPU workers) through
`FsdpStrategy`: 2 ranks save A; 1 rank restores A (and damaged or old-format copies of it)
and saves B; 2 ranks restore B (and a copy whose shard lives on a node that is gone); then 3
ranks on two simulated nodes (1 + 2 workers, each node its own directory) restore A and B
from copies whose shards lie on one node only (sent over the process group) or on none.
Each rank must then hold exactly its slice of the full tensors that were saved: model,
Adam's moments, EMA, with dim-0 sizes uneven over 2 ranks (5 rows: 3 + 2) and an empty
chunk (1 row: 1 + 0); buffers, the optimizer's step counts and the rank's own state from
old rank 0.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.checkpoint.sharded import consolidated_model, read_shard, shard_table
from tests.support import SCRIPTS, assert_ok, run_torchrun, worker_env
from tests.support.processes import run_python_module


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


def expect_slices(results: list[dict], run: Path, restored: str | None = None) -> None:
    """Each new rank holds exactly its rows of every full tensor saved in `run` (restored
    as `restored`: by default run/last.pt)."""
    data = read_checkpoint(run / "last.pt")
    reference = torch.load(run / "reference.pt", weights_only=True)
    ema = consolidated_model(run / "last.pt", data, ema=True)
    first = read_shard(run, data, 0)["payload"]
    for held in results:
        held = held[restored or str(run / "last.pt")]
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
    assert "not reachable from any node of this world" in errors[0]
    assert "gone-host" in errors[0]
    assert "rank_0.pt" in errors[0]


# ----------------------------------------------------------------------------------------
# Old shards on some nodes only: sent over the process group by a rank that has them.


def launch_two_nodes(root: Path, layouts: dict[str, tuple[Path | None, Path | None]]
                     ) -> list[dict]:
    """recut_shards on two simulated nodes (as tests/core/launch/test_multinode.py: a
    torchrun agent per node, each in its own working directory): node 0 runs global rank 0,
    node 1 ranks 1 and 2. Each layout NAME puts the run directory (pair[0]) at NAME/ on node
    0 and the one of pair[1] on node 1 (None: nothing there); NAME/last.pt is restored, a
    relative path that each node resolves in its own directory."""
    cwds = [root / "node0", root / "node1"]
    for node, cwd in enumerate(cwds):
        cwd.mkdir(parents=True)
        for name, pair in layouts.items():
            if pair[node] is not None:
                shutil.copytree(pair[node], cwd / name)
    out = root / "out"
    out.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)

    def node(rank: int) -> subprocess.CompletedProcess[str]:
        return run_python_module(
            "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={rank + 1}",
            f"--node-rank={rank}", "--master-addr=127.0.0.1", f"--master-port={port}",
            "--monitor-interval=0.2", "-m", "recut_shards", "--out", str(out), "--restore",
            *(f"{name}/last.pt" for name in layouts), cwd=cwds[rank],
            env=worker_env(PYTHONPATH=path), timeout=180)

    with ThreadPoolExecutor(max_workers=2) as pool:  # both nodes' agents at once
        for proc in pool.map(node, range(2)):
            assert_ok(proc)
    return [torch.load(out / f"result_{r}.pt", weights_only=True) for r in range(3)]


@pytest.fixture(scope="module")
def on_two_nodes(runs: dict) -> list[dict]:
    """A (2 shards) and B (1 shard) continued on 3 ranks over two nodes whose copies of the
    run directory differ; the manifest is always on node 0 (global rank 0 reads it)."""
    root = runs["root"]
    manifest_only = root / "B_manifest_only"
    shutil.copytree(root / "B", manifest_only, ignore=shutil.ignore_patterns("shards"))
    shards_only = root / "B_shards_only"
    shutil.copytree(root / "B" / "shards", shards_only / "shards")
    return launch_two_nodes(root / "two_nodes", {
        "split": (root / "A", None),  # A's shards on node 0 only
        "bad": (root / "A_bad", None),  # ... with old rank 1's corrupt
        "there": (manifest_only, shards_only),  # B's shard on node 1 only
        "gone": (root / "B_gone", None),  # B's shard on no node
    })


def test_shards_on_one_node_are_sent_to_the_ranks_of_the_other(on_two_nodes: list[dict],
                                                                runs: dict) -> None:
    """2 → 3 with A's shards on node 0 only: rank 0 sends ranks 1 and 2 (node 1) old rank
    0's structure and rows, and old rank 1's rows, which it does not need itself; 1 → 3 with
    B's shard on node 1 only: rank 1 sends it to rank 0, rank 2 reads its own copy.
    Catches: a shard absent here refused although a rank of this world holds it (the
    behaviour before); the sender taken as rank 0 (or any rank but one that holds it);
    rows sent from the recipient's offset instead of the old shard's; old rank 0's
    buffers, step counts or own state not sent with its rows."""
    cuts = [r["split/last.pt"]["cuts"]["0.weight"]["length"] for r in on_two_nodes]
    assert cuts == [2, 2, 1]
    expect_slices(on_two_nodes, runs["root"] / "A", "split/last.pt")
    expect_slices(on_two_nodes, runs["root"] / "B", "there/last.pt")


def test_an_old_shard_only_its_sender_reads_is_verified_by_it(on_two_nodes: list[dict]
                                                              ) -> None:
    """A's old rank 1 shard corrupt on node 0, its only holder (rank 0), which needs none of
    its rows. Catches: a sent shard's digest left unverified (only the shards a rank reads
    for itself checked), or the refusal reaching only some ranks."""
    errors = [r["bad/last.pt"].get("error") for r in on_two_nodes]
    assert errors[0] is not None and errors.count(errors[0]) == 3, errors
    assert "shard of rank 1" in errors[0] and "corrupt" in errors[0]
    assert "rank_1.pt" in errors[0] and "Nothing was loaded" in errors[0]


def test_a_shard_on_no_node_of_the_new_world_is_refused_by_name_on_every_rank(
        on_two_nodes: list[dict]) -> None:
    """B's shard written on a host that is gone and held by no node. Catches: the refusal
    left to the ranks that need its rows (others hang or go on), or not naming the file and
    the host."""
    errors = [r["gone/last.pt"].get("error") for r in on_two_nodes]
    assert errors[0] is not None and errors.count(errors[0]) == 3, errors
    assert "not reachable from any node of this world" in errors[0]
    assert "rank_0.pt" in errors[0] and "gone-host" in errors[0]
