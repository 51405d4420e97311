"""Sharded checkpoints under faults (R-SHARD-2, R-SHARD-3), real torchrun, 2 gloo workers.

One uninterrupted fsdp run is the reference; its model has dropout
(recovery_factories:with_dropout), so each rank's own RNG stream shapes its training. A
second run is SIGKILLed (kill_points.py) on rank 0 just before it publishes the manifest of
update K: every shard of that save is on disk, its manifest is not. It must leave update
K-1's checkpoint complete and verifying, no manifest of update K, and `--resume auto` must
then end bitwise equal to the reference.
Copies of the reference's run directory are resumed with a shard missing or damaged: from
that checkpoint named explicitly, refused naming each shard; as a run directory, from its
newest complete step file. Under ddp and with one worker, it is refused naming the
difference.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.names import step_files
from embodichain.core.checkpoint.sharded import SHARDS_DIR, read_shard, shard_table
from tests.support import (
    FACTORIES,
    SCRIPTS,
    assert_ok,
    run_cli,
    run_torchrun,
    workers_output,
    write_recipe,
)
from tests.support.recovery import factory_env
from tests.support.state_compare import assert_state_equal, comparable_records

GUARD = 240
K = 6
RUN = {"factory": "recovery_factories:with_dropout", "trainer.max_updates": 12,
       "trainer.save_every": 1, "trainer.log_every": 1, "trainer.validate_every": 4,
       "trainer.strategy": "fsdp", "trainer.keep_last": 3, "trainer.save_best": True}


def sharded_state(run: Path, name: str = "last.pt") -> dict[str, Any]:
    """Manifest payload (less its run identity) and every shard, verified."""
    data = read_checkpoint(run / name)
    shards = {}
    for rank in sorted(shard_table(data)):
        payload = read_shard(run, data, rank)["payload"]
        payload.pop("run")
        shards[rank] = payload
    payload = data["payload"]
    return {"step": payload["run"]["step"], "metrics": payload["run"]["metrics"],
            "learner": payload["learner"], "callbacks": payload["callbacks"],
            "shards": shards}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp_reference")
    recipe = write_recipe(root / "r.yaml", root / "run", **RUN)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=factory_env(), timeout=GUARD))
    return root / "run"


def test_each_rank_keeps_its_own_rng_streams_in_its_shard(reference: Path) -> None:
    """Each rank draws from its own streams (dropout here), so the two shards of a
    checkpoint hold different RNG states. Catches: rank 0's RNG state written into every
    rank's shard (rank 1 would resume on rank 0's streams)."""
    for name in ("last.pt", "step_10.pt"):
        shards = sharded_state(reference, name)["shards"]
        rng = [shards[r]["rank_state"]["rng"] for r in range(2)]
        assert not torch.equal(rng[0]["torch_cpu"], rng[1]["torch_cpu"]), name
        assert rng[0]["python"] != rng[1]["python"], name
        assert not torch.equal(rng[0]["numpy"]["keys"], rng[1]["numpy"]["keys"]), name


@pytest.mark.slow
def test_sigkill_before_a_manifest_is_published_then_resume_is_bitwise(
        reference: Path, tmp_path: Path) -> None:
    """Catches: a manifest published before every shard is durable, a resume that trusts
    shards without a manifest, shards of a cut-short save never cleaned, keep_last leaving
    shards of removed checkpoints, and any state (model, Adam's moments, each rank's own
    RNG streams, which its dropout draws from, sampler, metrics) not restored bitwise from
    the shards: e.g. rank 0's RNG state written into every rank's shard."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **RUN)
    mark = tmp_path / "mark.json"
    point = {"at": "replace", "name": "last.pt", "nth": K}
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        module="kill_points", timeout=GUARD,
                        env=factory_env(EMBODICHAIN_TEST_KILL_POINT=json.dumps(point),
                                        EMBODICHAIN_TEST_KILL_MARK=str(mark)))
    assert proc.returncode == 1 and mark.is_file(), proc.stdout + proc.stderr
    landed = json.loads(mark.read_text())
    assert landed["thread"] == f"embodichain-save-step_{K}.pt", landed
    # the previous checkpoint is complete; update K's manifest never appeared
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == K - 1
    assert sharded_state(run)["step"] == K - 1
    assert [s for s, _ in step_files(run)] == list(range(K - 3, K))
    shards = sorted(p.name for p in (run / SHARDS_DIR).iterdir())
    assert sum(name.startswith(f"step_{K}.") for name in shards) == 2, shards  # unpublished

    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume", "auto",
                           "--no-progress", env=factory_env(), timeout=GUARD))
    assert assert_state_equal(sharded_state(reference), sharded_state(run)) >= 20
    assert assert_state_equal(sharded_state(reference, "best.pt"),
                              sharded_state(run, "best.pt")) >= 10
    assert comparable_records(run) == comparable_records(reference)
    # only shards that a manifest names are left (keep_last 3, last.pt, best.pt)
    named = set()
    for manifest in run.glob("*.pt"):
        named |= {e["file"] for e in shard_table(read_checkpoint(manifest)).values()}
    assert {f"{SHARDS_DIR}/{p.name}" for p in (run / SHARDS_DIR).iterdir()} == named


def resume_copy(reference: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    (run / ".lock").unlink(missing_ok=True)
    return run


def contents(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*")
            if p.is_file() and p.name != ".lock"}


def refused(proc) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), out  # torchrun exits 1 for its workers' exit 2
    return out


def break_shards(run: Path) -> tuple[Path, Path]:
    """Delete rank 1's shard of last.pt (also step_12.pt's: the same save) and flip a byte
    of rank 0's; (missing, damaged)."""
    table = shard_table(read_checkpoint(run / "last.pt"))
    missing, damaged = run / table[1]["file"], run / table[0]["file"]
    missing.unlink()
    raw = bytearray(damaged.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    return missing, damaged


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_missing_and_damaged_shards_are_refused_by_name(reference: Path, tmp_path: Path
                                                        ) -> None:
    """Rank 1's shard deleted, rank 0's with one flipped byte: `--resume last.pt` (a
    checkpoint named explicitly) names both, before run.json or any file changes. Catches:
    a resume that loads the shards it finds and trains on a partial or corrupt state, one
    that stops at the first bad shard without naming the others, one that silently takes
    another checkpoint than the one named, or a refusal that has already recorded a
    resume."""
    run = resume_copy(reference, tmp_path)
    missing, damaged = break_shards(run)
    recipe = write_recipe(tmp_path / "r.yaml", run, **RUN)
    before = contents(run)
    out = refused(run_torchrun("train-sl", "--config", str(recipe), "--resume",
                               str(run / "last.pt"), "--no-progress", env=factory_env(),
                               timeout=GUARD))
    said = workers_output(out)
    assert f"shard of rank 1 is missing: {missing}" in said, out
    assert "shard of rank 0" in said and damaged.name in said and "corrupt" in said, out
    assert "Nothing was changed" in said, out
    assert contents(run) == before  # refused before run.json or any file was touched


@pytest.mark.slow
def test_resume_run_dir_whose_last_shards_are_bad_continues_from_a_complete_step_file(
        reference: Path, tmp_path: Path) -> None:
    """`resume RUN_DIR` whose last.pt (and step_12.pt, the same save) names a missing and a
    damaged shard continues from the newest complete snapshot, step_11.pt, says so, and
    ends bitwise equal to the uninterrupted run (R-RESUME-8, as for an unsharded run).
    Catches: a sharded manifest taken as complete without its shards (the resume refuses,
    or picks last.pt and fails at restore), or a fallback that does not say so."""
    run = resume_copy(reference, tmp_path)
    missing, damaged = break_shards(run)
    proc = run_torchrun("resume", str(run), "--no-progress", env=factory_env(),
                        timeout=GUARD)
    assert_ok(proc)
    out = proc.stdout + proc.stderr
    assert "last.pt is damaged (shard of rank 0" in out and str(missing) in out, out
    assert "continuing from step_11.pt (update 11)" in out, out
    assert sharded_state(run)["step"] == 12
    assert assert_state_equal(sharded_state(reference), sharded_state(run)) >= 20
    assert comparable_records(run) == comparable_records(reference)
    assert (run / "last.pt.damaged").is_file()  # set aside, not deleted


def test_another_strategy_and_world_size_are_refused_by_name(reference: Path,
                                                             tmp_path: Path) -> None:
    """The 2-worker fsdp checkpoint resumed in one process under ddp: both differences are
    named, nothing is created. Catches: a sharded checkpoint restored under ddp (its model
    entry is a shard table, not weights), or at another world size."""
    recipe = write_recipe(tmp_path / "ddp.yaml", tmp_path / "fresh",
                          **{**RUN, "trainer.strategy": "ddp"})
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(reference / "last.pt"),
                   "--no-progress", env=factory_env())
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "trainer.strategy: checkpoint 'fsdp', this run 'ddp'" in proc.stderr, proc.stderr
    assert "world_size: checkpoint 2, this run 1" in proc.stderr, proc.stderr
    assert not (tmp_path / "fresh").exists() or not list((tmp_path / "fresh").glob("*.pt"))


@pytest.mark.slow
def test_a_shard_write_failing_on_rank_one_stops_every_rank(tmp_path: Path) -> None:
    """tests/factories/sharded_blocks.py:failing_shard_on_rank_one fills rank 1's disk from
    update 6: its background write of update 8's shard fails. Catches: a failure that only
    rank 1 hears of (rank 0 would publish a manifest naming a shard that is not there, or
    hang), a message that does not name the rank and host, and a manifest published anyway."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run,
                          factory="sharded_blocks:failing_shard_on_rank_one",
                          **{"trainer.max_updates": 16, "trainer.save_every": 4,
                             "trainer.log_every": 1, "trainer.validate_every": 0,
                             "trainer.strategy": "fsdp"})
    env = factory_env()
    env["PYTHONPATH"] = os.pathsep.join([str(FACTORIES), str(SCRIPTS), env["PYTHONPATH"]])
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env,
                        timeout=GUARD)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"saving sharded checkpoint {run / 'step_8.pt'} failed" in out, out
    assert "File too large" in out and "(shard of rank 1 on host" in out, out
    assert out.count("[rank 1] error: saving sharded checkpoint") == 1, out
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 4
    assert not (run / "step_8.pt").exists() and not (run / "step_12.pt").exists()
    assert sharded_state(run)["step"] == 4  # the published checkpoint is whole
