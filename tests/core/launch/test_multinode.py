"""Several machines (R-DIST-6, R-DIST-7, R-LAUNCH-1): two torchrun agents on this machine.

Each "node" is a torchrun agent with one worker, started from its own empty working
directory, so relative paths (output_dir) point at different places, as on machines that
share no filesystem. Global rank 0 runs on node 0 (static rendezvous).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import (
    REPO,
    RESTART_RECIPE,
    assert_ok,
    run_cli,
    worker_env,
    write_recipe,
)
from tests.support.processes import run_python_module
from tests.support.state_compare import assert_same_outcome, comparable_records, implied_events

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

FACTORIES = REPO / "tests" / "factories"
RECIPE = RESTART_RECIPE
RUN = "outputs/run"  # relative: each node resolves it in its own working directory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(tmp_path: Path, **changes_on_node_1: object) -> tuple[Path, Path]:
    """Two empty working directories, each with the recipe (node 1's possibly changed)."""
    dirs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        write_recipe(cwd / "r.yaml", Path(RUN), **RECIPE,
                     **(changes_on_node_1 if node == 1 else {}))
        dirs.append(cwd)
    return dirs[0], dirs[1]


def _two_nodes(cwds: tuple[Path, Path], *args: str, rdzv: str = "static",
               max_restarts: int = 0, env: dict[str, str] | None = None
               ) -> list[subprocess.CompletedProcess[str]]:
    """Run `torchrun --nnodes=2 --nproc-per-node=1 ... -m embodichain ARGS` as both nodes."""
    port = _free_port()
    if rdzv == "static":
        rendezvous = ["--master-addr=127.0.0.1", f"--master-port={port}"]
    else:
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                      f"--rdzv-id={uuid.uuid4().hex[:8]}"]
    def node(rank: int) -> subprocess.CompletedProcess[str]:
        return run_python_module(
            "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}",
            *rendezvous, f"--max-restarts={max_restarts}", "--monitor-interval=0.2",
            "-m", "embodichain", *args, "--no-progress", cwd=cwds[rank],
            env=env or worker_env(PYTHONPATH=str(FACTORIES)))

    with ThreadPoolExecutor(max_workers=2) as pool:  # both nodes' agents at once
        return list(pool.map(node, range(2)))


def _assert_equal_runs(run: Path, reference: Path, events: list[tuple] | None = None,
                      records_after: int = 0) -> None:
    """The whole outcome equals the one-node reference's (`assert_same_outcome`): every
    checkpoint, metrics.jsonl (beyond `records_after`) and run.json's events."""
    assert assert_same_outcome(run, reference, events=events or [],
                               records_after=records_after) >= 18 * 2


def _assert_clean(cwd: Path) -> None:
    """Only the recipe: no run directory, checkpoint or lock on a node without rank 0."""
    assert sorted(p.name for p in cwd.rglob("*")) == ["r.yaml"]


@pytest.fixture()
def reference(restart_reference: Path) -> Path:
    """The recipe trained by 2 workers on one node with a plain torchrun launch (conftest,
    shared with tests/recovery/test_recovery_restart.py; read-only)."""
    return restart_reference


# c10d only: a static rendezvous trains its first 130 updates, then the rest after a restart,
# in test_resume_auto_survives_a_sigkill_of_node_1s_worker, which compares that whole run
# (every checkpoint, record and event) with the reference the same way and node 1's
# directory alike; another uninterrupted static launch would repeat it.
@pytest.mark.parametrize("rdzv", ["c10d"])
def test_two_nodes_train_exactly_like_one_node(rdzv: str, reference: Path, tmp_path: Path
                                               ) -> None:
    """Catches any difference from one node in a checkpoint, a record or an event, and a
    node without rank 0 that writes anything."""
    cwds = _nodes(tmp_path)
    for proc in _two_nodes(cwds, "train-sl", "--config", "r.yaml", rdzv=rdzv):
        assert_ok(proc)
    # The run directory lives where global rank 0 runs; c10d may put it on either node.
    holder = [cwd for cwd in cwds if (cwd / RUN).exists()]
    assert len(holder) == 1
    _assert_clean(cwds[1] if holder[0] == cwds[0] else cwds[0])
    _assert_equal_runs(holder[0] / RUN, reference)


def test_after_a_sigkill_of_node_1s_worker_resume_ckpt_and_resume_run_dir_continue_exactly(
        reference: Path, tmp_path: Path) -> None:
    """Without restarts the job dies; both ways to continue work, on both nodes, although
    only node 0 holds the run directory and its checkpoints. Catches an in-place resume
    that does not roll back the record past the snapshot (or does not record it as a
    `rolled_back` event of 1 record) and any inexact state of either continuation."""
    cwds = _nodes(tmp_path)
    kills = [{"id": "node1", "rank": 1, "update": 135}]
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_KILLS=json.dumps(kills),
                     EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "kills.log"))
    crashed = _two_nodes(cwds, "train-sl", "--config", "r.yaml", env=env)
    assert all(proc.returncode != 0 for proc in crashed)
    run = cwds[0] / RUN
    assert comparable_records(run)[-1]["step"] == 130  # beyond the snapshot at 120: to roll back

    # 1. Into a fresh directory: only node 0 has the checkpoint.
    for proc in _two_nodes(cwds, "train-sl", "--config", "r.yaml", "--resume",
                           f"{RUN}/step_120.pt", "--set", "trainer.output_dir=outputs/resumed"):
        assert_ok(proc)
    resumed = cwds[0] / "outputs" / "resumed"
    _assert_equal_runs(resumed, reference, records_after=120)

    # 2. In place: node 1 has no run directory at all.
    events = implied_events(run, 120)
    assert events == [("rolled_back", 120, 1), ("resumed", 120)]  # the record of update 130
    for proc in _two_nodes(cwds, "resume", RUN):
        assert_ok(proc)
    _assert_clean(cwds[1])
    _assert_equal_runs(run, reference, events)


def test_resume_auto_survives_a_sigkill_of_node_1s_worker(reference: Path, tmp_path: Path
                                                         ) -> None:
    """Catches a restart that does not continue exactly from update 120 (one `resumed`
    event, nothing to roll back, every checkpoint and record the reference's)."""
    cwds = _nodes(tmp_path)
    kills = [{"id": "node1", "rank": 1, "update": 130}]
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_KILLS=json.dumps(kills),
                     EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "kills.log"))
    results = _two_nodes(cwds, "train-sl", "--config", "r.yaml", "--resume", "auto",
                         max_restarts=2, env=env)
    for proc in results:
        assert_ok(proc)
    assert (tmp_path / "kills.log").read_text().split() == ["node1"]
    _assert_clean(cwds[1])
    # killed during update 130 (records up to 120, the snapshot's update): nothing to roll back
    _assert_equal_runs(cwds[0] / RUN, reference, [("resumed", 120)])


def test_node_1_with_other_data_is_refused_naming_both_sides(tmp_path: Path) -> None:
    cwds = _nodes(tmp_path, **{"data.seed": 4321})
    results = _two_nodes(cwds, "train-sl", "--config", "r.yaml")
    assert all(proc.returncode != 0 for proc in results)
    err = results[0].stderr
    assert "exitcode  : 2" in err, err
    message = next(line for line in err.splitlines() if line.startswith("error: the ranks"))
    assert "source identities differ" in message
    lines = err.split(message, 1)[1].splitlines()[1:3]
    assert any("rank 0 on " in line for line in lines) and any("rank 1 on " in line
                                                               for line in lines)
    assert lines[0].split(":")[1] != lines[1].split(":")[1]  # both identities named
    assert not (cwds[0] / "outputs").exists()
    _assert_clean(cwds[1])


def test_resume_auto_refuses_when_only_another_node_has_the_run(reference: Path,
                                                                tmp_path: Path) -> None:
    cwds = _nodes(tmp_path)
    shutil.copytree(reference, cwds[1] / RUN)  # rank 0 will run on node 0 this time
    results = _two_nodes(cwds, "train-sl", "--config", "r.yaml", "--resume", "auto")
    assert all(proc.returncode != 0 for proc in results)
    host = socket.gethostname()
    assert f"rank 0 on {host} finds no run in {RUN}, but rank 1 on {host} finds one" \
        in results[0].stderr
    assert not (cwds[0] / "outputs").exists()  # not started over


def test_self_launch_matches_torchrun_and_reports_refusals_once(reference: Path,
                                                                tmp_path: Path) -> None:
    """Catches a self-launched run that differs from torchrun's in any checkpoint, record
    or event (e.g. workers not given the command's `--set`: the recipe logs every 20
    updates, `--set` gives the reference's 10), and a refusal reported more than once (by
    the launcher as well, or by every worker, `[rank 1] error: ...`)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{**RECIPE, "trainer.log_every": 20})
    args = ["train-sl", "--config", str(recipe), "--set", "trainer.log_every=10",
            "--nproc-per-node", "2", "--no-progress"]
    env = worker_env(PYTHONPATH=str(FACTORIES))
    assert_ok(run_cli(*args, env=env))
    assert json.loads((run / "run.json").read_text())["world_size"] == 2
    _assert_equal_runs(run, reference)

    refused = run_cli(*args, env=env)
    assert refused.returncode == 2  # every worker refused; torchrun's report names their 2s
    assert refused.stderr.count("exitcode  : 2") == 2
    printed = [line for line in refused.stderr.splitlines()
               if re.match(r"(\[rank \d+\] )?error:", line)]
    assert len(printed) == 1 and printed[0].startswith("error:"), printed
    assert "already holds a run" in printed[0]


# -- sharded checkpoints on machines that share no filesystem -----------------------------

FSDP_RECIPE = {"trainer.max_updates": 8, "trainer.save_every": 4, "trainer.validate_every": 4,
               "trainer.log_every": 1, "trainer.strategy": "fsdp"}


def _shards_of(run: Path, shard_runs: dict[int, Path], name: str = "last.pt") -> dict:
    """Every rank's verified shard of `name`, each read from the node that holds it."""
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.sharded import read_shard, shard_table

    data = read_checkpoint(run / name)
    shards = {}
    for rank in sorted(shard_table(data)):
        payload = read_shard(shard_runs[rank], data, rank)["payload"]
        payload.pop("run")
        shards[rank] = payload
    return {"learner": data["payload"]["learner"], "shards": shards}


def test_fsdp_on_two_nodes_keeps_each_shard_where_its_rank_runs(tmp_path: Path) -> None:
    """Each node writes its rank's shard into its own copy of the run directory, rank 0's
    node also the manifests, and trains bitwise like one node with 2 workers; `resume
    RUN_DIR` on both nodes continues bitwise like it when last.pt's shard on node 1 alone is
    bad (another save's file in its place): from step_4.pt, saying so; when no snapshot has
    node 1's shard, it is refused naming the shard and its host with nothing changed, as
    `--resume CKPT` is. Catches:
    every shard written (or looked for) on rank 0's node only, node 1 writing manifests or
    run.json, a resume that loads without node 1's shard, and rank 0 choosing a snapshot by
    its own node's shards alone (it takes last.pt: the run is "complete" at update 8 instead
    of falling back, and with no complete snapshot it is refused only at restore, after
    run.json was changed or, for `--resume CKPT`, after a fresh directory was claimed)."""
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.sharded import SHARDS_DIR, shard_table
    from tests.support import run_torchrun
    from tests.support.state_compare import assert_state_equal

    one = tmp_path / "one_node"
    one.mkdir()
    write_recipe(one / "r.yaml", Path(RUN), **FSDP_RECIPE)
    assert_ok(run_torchrun("train-sl", "--config", "r.yaml", "--no-progress", cwd=one))

    cwds = [tmp_path / "node0", tmp_path / "node1"]
    for cwd in cwds:
        cwd.mkdir()
        write_recipe(cwd / "r.yaml", Path(RUN), **FSDP_RECIPE)
    for proc in _two_nodes(cwds, "train-sl", "--config", "r.yaml"):
        assert_ok(proc)
    run0, run1 = cwds[0] / RUN, cwds[1] / RUN
    assert sorted(p.name for p in run1.iterdir()) == [SHARDS_DIR]  # no manifest, no run.json
    assert all(".rank_1." in p.name for p in (run1 / SHARDS_DIR).iterdir())
    assert all(".rank_0." in p.name for p in (run0 / SHARDS_DIR).iterdir())
    assert (run0 / "last.pt").is_file() and (run0 / "step_4.pt").is_file()

    reference = one / RUN

    def assert_like_reference() -> None:
        assert assert_state_equal(_shards_of(reference, {0: reference, 1: reference}),
                                  _shards_of(run0, {0: run0, 1: run1})) >= 10
        assert comparable_records(run0) == comparable_records(reference)

    assert_like_reference()

    # Node 1's shard of last.pt (update 8) replaced by its shard of update 4: a valid file,
    # of another save. Only rank 1 can see it; step_4.pt is complete on both nodes. The
    # resume continues from there on both nodes, each rank loading its own node's shard.
    def rank_1_shard(name: str) -> Path:
        return run1 / shard_table(read_checkpoint(run0 / name))[1]["file"]

    shutil.copyfile(rank_1_shard("step_4.pt"), rank_1_shard("last.pt"))
    results = _two_nodes(cwds, "resume", RUN, "--set", "trainer.max_updates=8")
    out = "".join(p.stdout + p.stderr for p in results)
    for proc in results:
        assert_ok(proc)
    assert "continuing from step_4.pt (update 4)" in out, out  # not "complete" at last.pt
    note = next(line for line in out.splitlines() if "continuing from step_4.pt" in line)
    assert "last.pt is damaged (shard of rank 1" in note and "does not match" in note, note
    assert f"on {socket.gethostname()}" in note, note
    assert_like_reference()

    for shard in (run1 / SHARDS_DIR).iterdir():
        shard.unlink()
    def files() -> dict[str, bytes]:  # run.json, metrics, manifests (not the lock's holder)
        return {p.name: p.read_bytes() for p in run0.iterdir()
                if p.is_file() and p.name != ".lock"}

    before = files()
    results = _two_nodes(cwds, "resume", RUN, "--set", "trainer.max_updates=12")
    out = "".join(p.stdout + p.stderr for p in results)
    assert all(p.returncode != 0 for p in results), out
    assert "shard of rank 1 is missing" in out and socket.gethostname() in out, out
    assert files() == before  # refused before run.json's `resumed` event, before any set-aside

    # Named explicitly, the checkpoint is refused before a fresh directory is claimed for it.
    results = _two_nodes(cwds, "train-sl", "--config", "r.yaml", "--resume", f"{RUN}/step_4.pt",
                         "--set", "trainer.output_dir=outputs/other")
    out = "".join(p.stdout + p.stderr for p in results)
    assert all(p.returncode != 0 for p in results), out
    assert f"{RUN}/step_4.pt: shard of rank 1 is missing" in out, out
    assert not (cwds[0] / "outputs" / "other").exists()
