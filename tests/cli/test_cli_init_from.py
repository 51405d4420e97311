"""`train-sl --init-from CKPT`: a new run from earlier weights (issue 34), real processes.

The new runs use tests/factories/initial_dump.py, which writes the model's weights as the
run starts them (after the strategy has prepared the model) so they are compared bitwise
with the source's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import consolidated_model
from tests.support import assert_ok, run_cli, run_torchrun, write_recipe
from tests.support.processes import factories_env

NEW = {"factory": "initial_dump:build_supervised_trainer", "trainer.max_updates": 1,
       "trainer.save_every": 1, "trainer.validate_every": 0}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain checkpoint with EMA weights that differ from the model's."""
    root = tmp_path_factory.mktemp("init_source")
    recipe = write_recipe(root / "r.yaml", root / "run", **{
        "trainer.max_updates": 3, "trainer.save_every": 3, "trainer.validate_every": 0,
        "trainer.ema": {"decay": 0.5}})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    return root / "run" / "last.pt"


def start(tmp_path: Path, init_from: Path, *options: str, nproc: int = 1,
          **changes: object) -> tuple[object, Path, Path]:
    """train-sl of a new run from `init_from`: (process, its run directory, its dumps)."""
    dumps = tmp_path / "dumps"
    dumps.mkdir(exist_ok=True)
    recipe = write_recipe(tmp_path / "new.yaml", tmp_path / "new", **{**NEW, **changes})
    args = ("train-sl", "--config", str(recipe), "--no-progress", "--init-from",
            str(init_from), *options)
    env = factories_env(INIT_DUMP_DIR=str(dumps))
    proc = (run_torchrun(*args, nproc=nproc, env=env) if nproc > 1
            else run_cli(*args, env=env))
    return proc, tmp_path / "new", dumps


def assert_weights(dump: Path, expected: dict[str, torch.Tensor]) -> None:
    started = torch.load(dump, weights_only=True)
    assert started.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(started[name], value), name


def test_new_run_starts_from_the_model_or_ema_weights_bitwise(source: Path, tmp_path: Path
                                                               ) -> None:
    """The new run's model starts bitwise at the checkpoint's model (its EMA's with
    --init-from-ema), under a new run id at update 0, and run.json records the source.
    Catches: the weights not loaded (the seed's initialisation trains), --init-from-ema
    ignored (the model's weights taken), and a run.json without `initialized_from`."""
    learner = read_checkpoint(source)["payload"]["learner"]
    assert any(not torch.equal(learner["model"][k], learner["ema"][k]) for k in learner["ema"])
    for ema, expected in ((False, learner["model"]), (True, learner["ema"])):
        where = tmp_path / ("ema" if ema else "model")
        where.mkdir()
        proc, run, dumps = start(where, source, *(["--init-from-ema"] if ema else []))
        assert_ok(proc)
        assert_weights(dumps / "rank0.pt", expected)
        identity = json.loads((run / "run.json").read_text())
        record = identity["initialized_from"]
        assert record["path"] == str(source.resolve()) and record["step"] == 3
        assert record["ema"] is ema and len(record["sha256"]) == 64
        assert record["run_id"] != identity["run_id"] and identity["resumed_from"] is None
        assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 1  # its own count


def test_new_run_starts_from_an_exported_state_dict(source: Path, tmp_path: Path) -> None:
    """An `embodichain export` file is a source too. Catches: an export refused as 'not a
    checkpoint', or read other than bitwise."""
    out = tmp_path / "model.pt"
    assert_ok(run_cli("export", str(source), str(out), "--ema"))
    proc, run, dumps = start(tmp_path, out)
    assert_ok(proc)
    assert_weights(dumps / "rank0.pt", torch.load(out, weights_only=True))
    assert json.loads((run / "run.json").read_text())["initialized_from"]["kind"] == "export"


def test_shape_mismatch_is_refused_by_name_before_anything(source: Path, tmp_path: Path
                                                           ) -> None:
    """A model whose tensors have other shapes is refused (exit 2) naming each tensor and
    both shapes, and nothing is written. Catches: a load that fails with torch's traceback
    (exit 1) or that writes the run directory first."""
    proc, run, _ = start(tmp_path, source, **{"model.hidden": 16})
    assert proc.returncode == 2, proc.stderr
    assert "0.weight: (32, 4)" in proc.stderr and "(16, 4) in the model" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run.exists()


def test_missing_and_unexpected_tensors_refused_unless_allowed(source: Path, tmp_path: Path
                                                               ) -> None:
    """A model with a new head (3.weight, 3.bias) the checkpoint lacks is refused listing
    them, and starts with --init-allow-missing (the rest loaded bitwise); a file with a
    tensor the model lacks likewise with --init-allow-unexpected. Catches: missing or
    extra tensors silently ignored (a typo in a key would train from the seed unnoticed),
    or the allowing options not honoured."""
    model = read_checkpoint(source)["payload"]["learner"]["model"]
    head = {"INIT_EXTRA_HEAD": "1"}
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    recipe = write_recipe(tmp_path / "new.yaml", tmp_path / "new", **NEW)
    args = ("train-sl", "--config", str(recipe), "--no-progress", "--init-from", str(source))
    refused = run_cli(*args, env=factories_env(**head))
    assert refused.returncode == 2, refused.stderr
    assert "missing from" in refused.stderr and "3.bias, 3.weight" in refused.stderr
    assert not (tmp_path / "new").exists()
    allowed = run_cli(*args, "--init-allow-missing",
                      env=factories_env(INIT_DUMP_DIR=str(dumps), **head))
    assert_ok(allowed)
    started = torch.load(dumps / "rank0.pt", weights_only=True)
    assert all(torch.equal(started[k], v) for k, v in model.items())

    extra = tmp_path / "extra.pt"
    torch.save({**model, "extra.weight": torch.zeros(3)}, extra)
    other = tmp_path / "other"
    other.mkdir()
    proc, run, _ = start(other, extra)
    assert proc.returncode == 2 and "not in the model" in proc.stderr, proc.stderr
    assert "extra.weight" in proc.stderr and not run.exists()
    proc, run, dumps = start(other, extra, "--init-allow-unexpected")
    assert_ok(proc)
    assert_weights(dumps / "rank0.pt", model)


def test_init_from_with_resume_is_refused(source: Path, tmp_path: Path) -> None:
    """--init-from and --resume together are refused naming both. Catches: one of them
    silently winning (a resume that is not exact, or a new run that was meant to resume)."""
    proc, run, _ = start(tmp_path, source, "--resume", str(source))
    assert proc.returncode == 2
    assert "--init-from" in proc.stderr and "--resume" in proc.stderr
    assert not run.exists()


def test_from_a_sharded_checkpoint_into_ddp_and_fsdp(tmp_path: Path) -> None:
    """A sharded (fsdp, 2 workers) checkpoint starts a one-process ddp run and a 2-worker
    fsdp run, each rank's model (gathered) bitwise the consolidated weights; resuming it
    in one process is refused naming both ways forward, with a suggested command that
    keeps the user's --set trainer.output_dir. Catches: weights loaded after FSDP sharded
    the model (or on rank 0 only), a sharded manifest refused as a source, and a suggested
    command that drops --set (it would aim at the recipe's own output_dir)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "recipe_dir", **{
        "trainer.strategy": "fsdp", "trainer.max_updates": 2, "trainer.save_every": 2,
        "trainer.validate_every": 0})
    sharded = tmp_path / "sharded"
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           "--set", f"trainer.output_dir={sharded}", env=factories_env()))
    manifest = sharded / "last.pt"
    whole = consolidated_model(manifest, read_checkpoint(manifest))

    for strategy, nproc in (("ddp", 1), ("fsdp", 2)):
        where = tmp_path / strategy
        where.mkdir()
        proc, run, dumps = start(where, manifest, nproc=nproc,
                                 **{"trainer.strategy": strategy})
        assert_ok(proc)
        for rank in range(nproc):
            assert_weights(dumps / f"rank{rank}.pt", whole)
        assert json.loads((run / "run.json").read_text())["initialized_from"]["kind"] == \
            "sharded checkpoint"

    refused = run_cli("train-sl", "--config", str(recipe), "--no-progress", "--resume",
                      str(manifest), "--set", f"trainer.output_dir={tmp_path / 'resumed'}")
    assert refused.returncode == 2, refused.stderr
    text = " ".join(refused.stderr.split())
    assert "trainer.global_batch_size" in text and "--init-from" in text
    assert f"--resume {manifest} --set trainer.output_dir={tmp_path / 'resumed'}" in text


def test_a_missing_source_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    """--init-from a file that does not exist, with --nproc-per-node 2: refused by name
    (exit 2) by the launching command itself. Catches: workers started only to refuse it
    each (torchrun's failure report), or a run directory created first."""
    proc, run, _ = start(tmp_path, tmp_path / "absent.pt", "--nproc-per-node", "2")
    assert proc.returncode == 2, proc.stderr
    assert f"--init-from {tmp_path / 'absent.pt'}: no such" in proc.stderr
    assert "Failures" not in proc.stderr and "exitcode" not in proc.stderr, proc.stderr
    assert not run.exists()


def test_a_file_sharing_no_tensor_is_refused_even_with_both_allow_flags(
        source: Path, tmp_path: Path) -> None:
    """A state_dict none of whose tensors the model has, given both allow flags, is refused
    (exit 2) naming both sides' tensors, and nothing is written. Catches the run accepted
    and trained from its seed (exit 0) as if the weights had been loaded (issue 40)."""
    foreign = tmp_path / "foreign.pt"
    torch.save({"encoder.weight": torch.ones(3, 3), "encoder.bias": torch.zeros(3)}, foreign)
    proc, run, _ = start(tmp_path, foreign, "--init-allow-missing", "--init-allow-unexpected")
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())
    assert "shares no tensor with the model" in said, said
    assert "encoder.bias, encoder.weight" in said and "0.bias, 0.weight" in said
    assert not run.exists()


def test_init_skip_reinitialises_a_resized_head_and_loads_the_rest_bitwise(
        tmp_path: Path) -> None:
    """A model whose head grew (3.weight (2, 2) -> (3, 2), 4.weight (2, 2) -> (2, 3)):
    refused naming the head and --init-skip; with `--init-skip '^[34]\\.'` the rest is
    loaded bitwise, the head keeps the seed's initialisation bitwise (a run without
    --init-from), and the summary says what was loaded and what was left. Catches
    --init-skip ignored (a shape-mismatch refusal or a failing copy), a skipped tensor
    still overwritten, and other tensors not loaded."""
    head = {"INIT_EXTRA_HEAD": "1", "INIT_HEAD_WIDTH": "2"}
    old = tmp_path / "old"
    old.mkdir()
    recipe = write_recipe(old / "r.yaml", old / "run", **NEW)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env(**head)))
    source = old / "run" / "last.pt"
    saved = read_checkpoint(source)["payload"]["learner"]["model"]
    grown = {**head, "INIT_HEAD_WIDTH": "3"}

    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "dumps").mkdir()
    assert_ok(run_cli("train-sl", "--config", str(write_recipe(seed / "r.yaml", seed / "run",
                                                                 **NEW)),
                      "--no-progress", env=factories_env(INIT_DUMP_DIR=str(seed / "dumps"),
                                                         **grown)))
    seeded = torch.load(seed / "dumps" / "rank0.pt", weights_only=True)

    refused_dir = tmp_path / "refused"
    refused_dir.mkdir()
    recipe = write_recipe(refused_dir / "new.yaml", refused_dir / "new", **NEW)
    args = ("train-sl", "--config", str(recipe), "--no-progress", "--init-from", str(source))
    refused = run_cli(*args, env=factories_env(**grown))
    assert refused.returncode == 2, refused.stderr
    said = " ".join(refused.stderr.split())
    assert "3.weight: (2, 2)" in said and "(3, 2) in the model" in said, said
    assert "--init-skip" in said and not (refused_dir / "new").exists()

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    proc = run_cli(*args, "--init-skip", r"^[34]\.",
                   env=factories_env(INIT_DUMP_DIR=str(dumps), **grown))
    assert_ok(proc)
    started = torch.load(dumps / "rank0.pt", weights_only=True)
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert torch.equal(started[name], saved[name]), name
    for name in ("3.weight", "3.bias", "4.weight", "4.bias"):
        assert torch.equal(started[name], seeded[name]), name
    said = " ".join(proc.stderr.split())
    assert "loaded 4 of the model's 8 tensors" in said, said
    assert "left at the model's initialisation: 4 (3.bias (--init-skip), 3.weight " \
           "(--init-skip), 4.bias (--init-skip)" in said


def test_the_catalogue_rank_zero_sends_holds_no_tensor(source: Path) -> None:
    """What rank 0 broadcasts for --init-from is a catalogue (names, shapes, where rows lie),
    never the weights: each rank reads its own rows. Catches the non-scaling variant in
    which rank 0 reads (or consolidates) the whole state and broadcasts it pickled
    (issue 41)."""
    import dataclasses

    from embodichain.core.checkpoint.initial_weights import InitFrom, read

    def tensors(value: object) -> int:
        if isinstance(value, torch.Tensor):
            return 1
        if isinstance(value, dict):
            return sum(tensors(v) for v in value.values())
        if isinstance(value, list | tuple):
            return sum(tensors(v) for v in value)
        return 0

    weights = read(InitFrom(source, ema=True))
    assert tensors([getattr(weights, f.name) for f in dataclasses.fields(weights)]) == 0
    assert weights.shapes["0.weight"] == (32, 4) and weights.pieces[0]["cuts"]["model"][
        "0.weight"] == [0, 32, 32]


@pytest.mark.slow
def test_init_from_under_max_restarts_reads_the_weights_only_at_the_first_start(
        source: Path, tmp_path: Path) -> None:
    """`--init-from` with `--resume auto --nproc-per-node 2 --max-restarts 1`: rank 1 is
    SIGKILLed at update 15, the restart continues from the run's snapshot at 10 (not from
    the initial weights again), and a later requeue of the same command continues although
    the initial file is gone. Catches --init-from refused with --resume auto (it could not
    run under --max-restarts), a restart that starts over from the file (a refused or
    replaced run directory), and a requeue that reads it again (the file must exist)."""
    copy = tmp_path / "init.pt"
    copy.write_bytes(source.read_bytes())
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{
        "factory": "restarting:build_supervised_trainer", "trainer.max_updates": 30,
        "trainer.save_every": 10, "trainer.validate_every": 10, "trainer.log_every": 5})
    env = factories_env(EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "k"),
                        EMBODICHAIN_TEST_KILLS=json.dumps([{"id": "a", "rank": 1,
                                                            "update": 15}]))
    command = ("train-sl", "--config", str(recipe), "--init-from", str(copy), "--resume",
               "auto", "--nproc-per-node", "2", "--max-restarts", "1", "--no-progress")
    proc = run_cli(*command, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "restarting all 2 workers" in proc.stderr
    assert "not read: --resume auto continues the run" in " ".join(proc.stderr.split())
    identity = json.loads((run / "run.json").read_text())
    assert identity["initialized_from"]["path"] == str(copy.resolve())
    assert [e["step"] for e in identity["events"] if e["event"] == "resumed"] == [10]
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 30

    copy.unlink()
    again = run_cli(*command, "--set", "trainer.max_updates=40", env=env)
    assert again.returncode == 0, again.stderr
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 40


@pytest.mark.slow
def test_fsdp_on_two_nodes_the_node_without_the_file_receives_only_its_rows(
        source: Path, tmp_path: Path) -> None:
    """FSDP over two simulated nodes (torchrun --nnodes=2, each node its own directory), the
    source named by a relative path that only node 0 holds: each rank's model starts bitwise
    at the source's weights, and rank 1 receives exactly the elements of its own shard from
    rank 0 (fewer than the model's). Catches the non-scaling variants in which a rank gets
    the whole state (a full tensor sent or broadcast to it), and a node that must hold the
    file (refused, or a crash, where it lacks it)."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.processes import run_python_module

    expected = read_checkpoint(source)["payload"]["learner"]["model"]
    cwds = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        write_recipe(cwd / "r.yaml", Path("run"), **{**NEW, "trainer.strategy": "fsdp"})
        cwds.append(cwd)
    (cwds[0] / "init.pt").write_bytes(source.read_bytes())
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Static rendezvous: --node-rank decides which node holds rank 0 (c10d's order follows
    # arrival, so the node without the file could become rank 0 under load).
    rendezvous = ["--master-addr=127.0.0.1", f"--master-port={port}"]

    def node(rank: int):  # noqa: ANN202
        return run_python_module(
            "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
            f"--node-rank={rank}", *rendezvous, "--monitor-interval=0.2", "-m",
            "embodichain", "train-sl", "--config", "r.yaml", "--no-progress", "--init-from",
            "init.pt", cwd=cwds[rank], env=factories_env(INIT_DUMP_DIR=str(dumps)))

    with ThreadPoolExecutor(max_workers=2) as pool:
        for proc in pool.map(node, range(2)):
            assert_ok(proc)
    for rank in range(2):
        assert_weights(dumps / f"rank{rank}.pt", expected)
    received, own = map(int, (dumps / "rank1.counts").read_text().split())
    whole = sum(t.numel() for t in expected.values())
    assert received == own < whole, (received, own, whole)
    assert (dumps / "rank0.counts").read_text().split()[0] == "0"
