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
