"""FSDP continued on another world size, whatever node holds which old shard (R-PREEMPT-2,
R-ELASTIC-3): the start-up asks every node which old shards it holds; a snapshot goes ahead
when every old shard lies on some node of the new world (a rank that lacks one receives its
rows from a holder), and is refused by name, before anything is written, when one lies on
none.

Each "node" is a torchrun agent started from its own working directory (as in
test_multinode.py), so the relative `outputs/run` is a different directory on each, as on
machines that share no filesystem. The recipe trains under trainer.global_batch_size (the
elastic recipe of tests/recovery/test_elastic_resume.py, shorter, without data workers):
a continuation on another world size ends within that module's bound (1e-5 relative, per
tensor) of the run never interrupted, and draws exactly its examples.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from embodichain.core.checkpoint.export import checkpoint_model
from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import read_shard
from tests.support import assert_ok, run_cli, write_recipe
from tests.support.data import data_env
from tests.support.processes import run_python_module
from tests.support.state_compare import assert_state_equal

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

RUN = "outputs/run"
ELASTIC = {"factory": "global_recording:build_supervised_trainer", "trainer.batch_size": 8,
           "trainer.global_batch_size": 32, "trainer.max_updates": 40,
           "trainer.save_every": 20, "trainer.validate_every": 0, "trainer.log_every": 10,
           "trainer.ema": {"decay": 0.9}, "trainer.strategy": "fsdp",
           "data.train_size": 200, "data.val_size": 16}
BOUND = 1e-5  # tests/recovery/test_elastic_resume.py says why


def _nodes(cwds: list[Path], procs: list[int], *args: str, records: Path
           ) -> list[subprocess.CompletedProcess[str]]:
    """`torchrun --nnodes=N --nproc-per-node=procs[i] -m embodichain ARGS` as node i, in
    cwds[i], all at once (static rendezvous: node 0 runs global rank 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def node(i: int) -> subprocess.CompletedProcess[str]:
        return run_python_module(
            "torch.distributed.run", f"--nnodes={len(cwds)}", f"--nproc-per-node={procs[i]}",
            f"--node-rank={i}", "--master-addr=127.0.0.1", f"--master-port={port}",
            "--monitor-interval=0.2", "-m", "embodichain", *args, "--no-progress",
            cwd=cwds[i], env=data_env(RECORD_DIR=str(records)))

    with ThreadPoolExecutor(max_workers=len(cwds)) as pool:
        return list(pool.map(node, range(len(cwds))))


def _cwds(root: Path, count: int = 2) -> list[Path]:
    cwds = []
    for i in range(count):
        cwd = root / f"node{i}"
        cwd.mkdir(parents=True)
        write_recipe(cwd / "r.yaml", Path(RUN), **ELASTIC)
        cwds.append(cwd)
    return cwds


def _records(directory: Path, after: int = 0) -> dict[int, list[int]]:
    """Each update's example indices in global order (rank by rank), beyond `after`."""
    lines = [json.loads(line) for path in sorted(directory.glob("rank*.jsonl"))
             for line in path.read_text().splitlines()]
    updates: dict[int, list[int]] = {}
    for r in sorted(lines, key=lambda r: (r["step"], r["rank"])):
        if r["step"] > after:
            updates.setdefault(r["step"], []).extend(r["index"])
    return updates


def _gathered(run: Path, *others: Path) -> Path:
    """`run`'s last.pt with every node's shards beside it (copied into `run`)."""
    for other in others:
        for shard in (other / "shards").iterdir():
            shutil.copy2(shard, run / "shards" / shard.name)
    return run / "last.pt"


def _assert_within_bound(reference: Path, continued: Path) -> None:
    """Every model and EMA tensor within BOUND of the uninterrupted run's."""
    a, b = read_checkpoint(reference), read_checkpoint(continued)
    assert b["manifest"]["step"] == a["manifest"]["step"]
    for ema in (False, True):
        full_a, full_b = checkpoint_model(reference, a, ema=ema), checkpoint_model(continued, b,
                                                                                   ema=ema)
        for name, x in full_a.items():
            if x.is_floating_point():
                assert float((x - full_b[name]).norm() / x.norm().clamp_min(1e-30)) <= BOUND, \
                    name


def _continues_as_uninterrupted(runs: dict[str, Path], cwds: list[Path], procs: list[int],
                                *args: str, from_to: tuple[int, int]) -> Path:
    """Run ARGS on the nodes (`procs` ranks each): the examples drawn after update 20 are
    the uninterrupted run's, the weights at update 40 within BOUND of its, and run.json
    records the world size's change `from_to` at update 20. The run directory on node 0."""
    records = cwds[0].parent / "records"
    records.mkdir()
    for proc in _nodes(cwds, procs, *args, records=records):
        assert_ok(proc)
    assert _records(records) == _records(runs["records"], after=20)
    run = cwds[0] / RUN
    _assert_within_bound(runs["reference"] / "last.pt", _gathered(run, cwds[1] / RUN))
    identity = json.loads((run / "run.json").read_text())
    assert identity["world_size_changes"] == [{"from": from_to[0], "to": from_to[1],
                                               "at_update": 20}]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The run never interrupted (one process, to update 40, step_20.pt kept) and the run
    trained to update 40 on two nodes of one rank each (each node holds its own shards)."""
    root = tmp_path_factory.mktemp("placement")
    reference, records = root / "reference", root / "reference_records"
    records.mkdir()
    recipe = write_recipe(root / "reference.yaml", reference, **ELASTIC)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=data_env(RECORD_DIR=str(records))))
    cwds = _cwds(root / "two_nodes")
    (root / "two_records").mkdir()
    for proc in _nodes(cwds, [1, 1], "train-sl", "--config", "r.yaml",
                       records=root / "two_records"):
        assert_ok(proc)
    assert {p.name.split(".")[-2] for p in (cwds[1] / RUN / "shards").iterdir()} == \
        {"rank_1"}  # node 1 holds only rank 1's shards
    return {"reference": reference, "records": records, "two_nodes": root / "two_nodes"}


def _at_update_20(runs: dict[str, Path], root: Path) -> list[Path]:
    """A copy of the two nodes' directories whose run stopped after update 20's snapshot:
    update 40's manifests removed (its metrics stay, to be rolled back)."""
    shutil.copytree(runs["two_nodes"], root)
    for name in ("step_40.pt", "last.pt"):
        (root / "node0" / RUN / name).unlink()
    return [root / "node0", root / "node1"]


def test_two_nodes_onto_one_without_the_other_nodes_files_is_refused_by_name(
        runs: dict[str, Path], tmp_path: Path) -> None:
    """2 nodes → 1 node, node 1's files gone. Catches the start-up check that skips old
    shards of ranks at or beyond the new world size (old rank 1 here): run.json then got the
    roll-back, the `resumed` event and `world_size_changes`, and only the restore refused;
    and a refusal that does not name the shard's file and the node that wrote it."""
    node0 = _at_update_20(runs, tmp_path / "nodes")[0]
    shutil.rmtree(tmp_path / "nodes" / "node1")
    run = node0 / RUN
    kept = ("run.json", "metrics.jsonl", ".lock")
    before = {name: (run / name).read_bytes() for name in kept}
    proc = run_cli("resume", RUN, "--set", "trainer.max_updates=40", "--no-progress",
                   cwd=node0, env=data_env(RECORD_DIR=str(tmp_path)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert {name: (run / name).read_bytes() for name in kept} == before
    assert "shard of rank 1 (outputs/run/shards/step_20." in proc.stderr, proc.stderr
    assert ".rank_1.pt, written on host " in proc.stderr and ", node 1)" in proc.stderr
    assert "not reachable from any node of this world" in proc.stderr


def test_a_newest_snapshot_with_a_shard_on_no_node_gives_way_to_a_complete_one(
        runs: dict[str, Path], tmp_path: Path) -> None:
    """2 nodes → node 0 alone, holding node 1's shard of update 20 but not of update 40.
    Catches the start-up check dropping an unreachable shard's problem (`_parts_elsewhere`
    without its `unreachable(...)`): the newest snapshot then passed as complete, so the run
    was called done at update 40 and nothing trained (where its only refusal was the
    restore's, which told it from the start-up's by message text alone). The snapshot of
    update 20, complete on this node, must be taken instead, and the run continue from it as
    the uninterrupted run did."""
    nodes = shutil.copytree(runs["two_nodes"], tmp_path / "nodes")
    run = nodes / "node0" / RUN
    for shard in (nodes / "node1" / RUN / "shards").glob("step_20.*"):
        shutil.copy2(shard, run / "shards" / shard.name)
    shutil.rmtree(nodes / "node1")
    records = tmp_path / "records"
    records.mkdir()
    assert_ok(run_cli("resume", RUN, "--no-progress", cwd=nodes / "node0",
                      env=data_env(RECORD_DIR=str(records))))
    assert _records(records) == _records(runs["records"], after=20)
    identity = json.loads((run / "run.json").read_text())
    assert identity["world_size_changes"] == [{"from": 2, "to": 1, "at_update": 20}]
    _assert_within_bound(runs["reference"] / "last.pt", run / "last.pt")


def test_one_node_onto_two_with_node_b_empty_continues(runs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """1 node of 1 rank → 2 nodes of 1 rank each, node B holding nothing (the checkpoint
    named by a path relative to each node's directory). Catches an old shard refused as
    missing for the new rank that lacks it although rank 0 holds it and can send its rows,
    rows sent from the wrong place, and examples drawn differently from the uninterrupted
    run."""
    cwds = _cwds(tmp_path)
    shutil.copytree(runs["reference"], cwds[0] / "reference")
    _continues_as_uninterrupted(runs, cwds, [1, 1], "train-sl", "--config", "r.yaml",
                                "--resume", "reference/step_20.pt", from_to=(1, 2))


def test_old_shard_of_node_b_found_where_node_b_runs_more_ranks(runs: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """Old placement A:{0}, B:{1} → new A:{0, 1}, B:{2, 3}. Catches the start-up check
    that assumes old shard r sits with new rank r: it asked new rank 1 (on node A) for old
    shard 1 and refused it as missing, though node B holds it; the re-cut then reads it on
    node B and sends rows to node A's ranks."""
    cwds = _at_update_20(runs, tmp_path / "nodes")
    run = _continues_as_uninterrupted(runs, cwds, [2, 2], "resume", RUN, "--set",
                                      "trainer.max_updates=40", from_to=(2, 4))
    assert read_checkpoint(run / "last.pt")["manifest"]["world_size"] == 4


def test_a_rank_on_an_empty_node_receives_its_own_shard_and_resumes_bitwise(
        runs: dict[str, Path], tmp_path: Path) -> None:
    """The same world size, node B replaced by an empty machine, its shards gathered on
    node A. Catches a rank that reads only its own node's copy of its shard (refused as
    missing though node A holds it), and a shard sent to it that is not exactly its own (the
    run then differs from the uninterrupted one, which it equals bitwise)."""
    cwds = _at_update_20(runs, tmp_path / "nodes")
    shutil.rmtree(cwds[1] / RUN)
    _gathered(cwds[0] / RUN, runs["two_nodes"] / "node1" / RUN)
    records = tmp_path / "records"
    records.mkdir()
    for proc in _nodes(cwds, [1, 1], "resume", RUN, records=records):
        assert_ok(proc)
    assert _records(records) == _records(runs["records"], after=20)
    reference = shutil.copytree(runs["two_nodes"] / "node0" / RUN, tmp_path / "reference")
    _gathered(reference, runs["two_nodes"] / "node1" / RUN)
    _gathered(cwds[0] / RUN, cwds[1] / RUN)
    assert assert_state_equal(_shards(reference), _shards(cwds[0] / RUN)) >= 10


def _shards(run: Path) -> dict:
    """last.pt's learner state and every rank's verified shard (all beside it)."""
    data = read_checkpoint(run / "last.pt")
    shards = {}
    for rank in range(int(data["manifest"]["world_size"])):
        payload = read_shard(run, data, rank)["payload"]
        payload.pop("run")
        shards[rank] = payload
    return {"learner": data["payload"]["learner"], "shards": shards}
