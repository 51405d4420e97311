"""R-RESUME-2/4/5, R-CKPT-5: resumes that must be refused, before training, changing nothing.

One process: exit 2 with the reason. Under torchrun: each worker exits 2, torchrun exits 1 with
its failure report, and the reason is printed once, by rank 0. The source run (a copy where the
test edits it) and the destination are compared byte for byte before and after.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.data.source import TensorSource
from embodichain.plugins import sl_ddp
from tests.support import (
    assert_ok,
    run_cli,
    run_torchrun,
    snapshot_dir,
    workers_output,
    write_recipe,
)
from tests.support.cli import cli_in_process
from tests.support.recovery import factory_env, metrics, rewrite_checkpoint, run_json

GUARD = 240


class Unchanged:
    """Byte snapshots of directories (or their absence) to compare after a refusal."""

    def __init__(self, *dirs: Path) -> None:
        self.before = {d: snapshot_dir(d) if d.exists() else None for d in dirs}

    def check(self) -> None:
        for directory, before in self.before.items():
            after = snapshot_dir(directory) if directory.exists() else None
            assert after == before, f"{directory} changed"


def fresh_destination(tmp_path: Path) -> Path:
    """An artifact-free output_dir that already holds an unrelated file."""
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "notes.txt").write_text("not a run\n")
    return dest


def assert_refused_once(proc: subprocess.CompletedProcess[str], *expected: str,
                        torchrun: bool) -> str:
    out = proc.stdout + proc.stderr
    if torchrun:
        assert proc.returncode == 1, out
        # torchrun's own failure report (its one traceback) names both workers' exit code 2
        assert out.count("Traceback") == 1 and "ChildFailedError" in out, out
        assert re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", out, re.M) == ["2", "2"], out
        assert "[rank 1]" not in out, out
        said = workers_output(out)  # torchrun's report repeats the message of each worker
    else:
        assert proc.returncode == 2, out
        assert "Traceback" not in out, out
        said = out
    for text in expected:
        assert said.count(text) == 1, f"expected {text!r} once in:\n{out}"
    return out


# -- R-RESUME-2: world size, recipe, source identity, training config ---------------------------


def test_refuses_a_different_world_size(sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """Catches a world-size change allowed without trainer.global_batch_size (each rank's
    per-worker batch would change every update's examples), and a refusal that does not
    name the two ways on: G for a new run, --init-from to start from the weights."""
    dest = fresh_destination(tmp_path)
    unchanged = Unchanged(sl_ddp_two_workers, dest)
    recipe = write_recipe(tmp_path / "r.yaml", dest)
    proc = run_cli("train-sl", "--config", str(recipe), "--resume",
                   str(sl_ddp_two_workers / "step_100.pt"), "--no-progress")
    assert_refused_once(proc, "world_size: checkpoint 2, this run 1", "Nothing was changed",
                        "trainer.global_batch_size", "--init-from", torchrun=False)
    unchanged.check()


def _identity(seed: int) -> str:
    return TensorSource(sl_ddp.make_corpus(4096, seed)).identity


@pytest.mark.parametrize("key, value, expected", [
    ("model.hidden", 16, ["model.hidden: checkpoint 32, this run 16"]),
    ("data.seed", 99, ["data.seed: checkpoint 1234, this run 99",
                       f"source identity: checkpoint {_identity(1234)}, this run "
                       f"{_identity(99)}"]),
    ("optimizer.lr", 0.002, ["optimizer.lr: checkpoint 0.001, this run 0.002"]),
    ("factory", "recovery_factories:save_in_validation",
     ["factory: checkpoint 'sl_ddp', this run 'recovery_factories:save_in_validation'"]),
])
def test_refuses_a_different_recipe_source_or_training_config(
        sl_ddp_one_process: Path, tmp_path: Path, key: str, value: object,
        expected: list[str]) -> None:
    dest = fresh_destination(tmp_path)
    unchanged = Unchanged(sl_ddp_one_process, dest)
    recipe = write_recipe(tmp_path / "r.yaml", dest, **{key: value})
    proc = run_cli("train-sl", "--config", str(recipe), "--resume",
                   str(sl_ddp_one_process / "step_100.pt"), "--no-progress", env=factory_env())
    out = assert_refused_once(proc, *expected, torchrun=False)
    listed = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(listed) == len(expected), out  # exactly the differing fields, nothing else
    unchanged.check()


def test_max_updates_may_be_raised_but_not_lowered_below_the_step(
        sl_ddp_one_process: Path, tmp_path: Path) -> None:
    dest = fresh_destination(tmp_path)
    unchanged = Unchanged(sl_ddp_one_process, dest)
    lowered = write_recipe(tmp_path / "low.yaml", dest, **{"trainer.max_updates": 50})
    proc = run_cli("train-sl", "--config", str(lowered), "--resume",
                   str(sl_ddp_one_process / "step_100.pt"), "--no-progress")
    assert_refused_once(proc, "trainer.max_updates: 50 is below the checkpoint's update 100",
                        torchrun=False)
    unchanged.check()

    raised = write_recipe(tmp_path / "high.yaml", tmp_path / "longer",
                          **{"trainer.max_updates": 220})
    assert_ok(run_cli("train-sl", "--config", str(raised), "--resume",
                      str(sl_ddp_one_process / "step_200.pt"), "--no-progress"))
    last = read_checkpoint(tmp_path / "longer" / "last.pt")
    assert last["manifest"]["step"] == 220
    assert [r["step"] for r in metrics(tmp_path / "longer")] == [210, 220]


def test_refuses_a_checkpoint_with_a_missing_or_extra_rank_entry(
        sl_ddp_one_process: Path, sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """R-CKPT-5, for files whose digest is fine but whose per-rank table is not."""
    def add_rank(payload: dict) -> None:
        payload["ranks"][1] = payload["ranks"][0]

    def drop_rank(payload: dict) -> None:
        del payload["ranks"][1]

    extra = rewrite_checkpoint(sl_ddp_one_process / "step_100.pt", tmp_path / "x" / "extra.pt",
                               add_rank)
    dropped = rewrite_checkpoint(sl_ddp_two_workers / "step_100.pt",
                                 tmp_path / "x" / "dropped.pt", drop_rank)
    read_checkpoint(dropped)  # a valid file: only restoring it is refused
    dest = fresh_destination(tmp_path)
    unchanged = Unchanged(tmp_path / "x", dest)
    recipe = write_recipe(tmp_path / "r.yaml", dest)
    for path, text in ((extra, "written by 1 worker(s) but holds per-rank state for rank(s) "
                               "0, 1 (unexpected entry 1)"),
                       (dropped, "written by 2 worker(s) but holds per-rank state for rank(s) "
                                 "0 (missing rank 1)")):
        proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(path),
                       "--no-progress")
        assert_refused_once(proc, text, torchrun=False)
    unchanged.check()


# -- R-RESUME-4: in place ------------------------------------------------------------------------


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _set_run_id(run: Path, run_id: str) -> None:
    data = run_json(run)
    data["run_id"] = run_id
    (run / "run.json").write_text(json.dumps(data, indent=2) + "\n")


FRESH_COMMAND = re.compile(r"embodichain train-sl --config \S+ --resume \S+ "
                           r"--set trainer\.output_dir=\S+")


def test_in_place_refuses_another_runs_directory(sl_ddp_one_process: Path, tmp_path: Path
                                                 ) -> None:
    run = _copy_run(sl_ddp_one_process, tmp_path / "run")
    _set_run_id(run, "0" * 32)
    unchanged = Unchanged(run)
    proc = run_cli("resume", str(run), "--no-progress")
    out = assert_refused_once(proc, f"holds run {'0' * 32}", torchrun=False)
    assert len(FRESH_COMMAND.findall(out)) == 1, out
    unchanged.check()


def test_in_place_refuses_history_beyond_the_checkpoint(sl_ddp_one_process: Path,
                                                        tmp_path: Path) -> None:
    run = _copy_run(sl_ddp_one_process, tmp_path / "run")
    unchanged = Unchanged(run)
    recipe = write_recipe(tmp_path / "r.yaml", run)
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(run / "step_100.pt"),
                   "--no-progress")
    out = assert_refused_once(proc, "already has records up to update 200, beyond the "
                                    "checkpoint's update 100", torchrun=False)
    assert f"--config {recipe} --resume {run / 'step_100.pt'}" in out
    assert len(FRESH_COMMAND.findall(out)) == 1, out
    unchanged.check()

    # also with the metrics cut back to update 100: step_200.pt would be replaced
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= 100))
    unchanged = Unchanged(run)
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(run / "step_100.pt"),
                   "--no-progress")
    out = assert_refused_once(proc, "already holds checkpoints beyond update 100 (step_200.pt)",
                              torchrun=False)
    assert len(FRESH_COMMAND.findall(out)) == 1, out
    unchanged.check()


# -- R-RESUME-5: no run identity ------------------------------------------------------------------


def _no_identity(payload: dict) -> None:
    payload["run"]["run_id"] = None


def _no_identity_key(payload: dict) -> None:
    """As written before run identities existed: no `run_id` key at all."""
    del payload["run"]["run_id"]


@pytest.mark.slow
@pytest.mark.parametrize("strip", [_no_identity, _no_identity_key], ids=["null", "absent"])
def test_checkpoint_without_identity_resumes_only_into_a_fresh_destination(
        sl_ddp_one_process: Path, tmp_path: Path, strip) -> None:
    run = _copy_run(sl_ddp_one_process, tmp_path / "run")
    anonymous = rewrite_checkpoint(run / "step_100.pt", run / "step_100.pt", strip)
    assert read_checkpoint(anonymous)["manifest"]["run_id"] is None
    if strip is _no_identity_key:
        assert "run_id" not in read_checkpoint(anonymous)["payload"]["run"]
        inspected = cli_in_process("inspect-checkpoint", str(anonymous))
        assert_ok(inspected)
        assert "no run identity: resumable only into a fresh directory" in inspected.stdout
    unchanged = Unchanged(run)
    in_place = write_recipe(tmp_path / "in_place.yaml", run)
    proc = run_cli("train-sl", "--config", str(in_place), "--resume", str(anonymous),
                   "--no-progress")
    out = assert_refused_once(proc, "carries no run identity", torchrun=False)
    assert len(FRESH_COMMAND.findall(out)) == 1, out
    unchanged.check()

    fresh = write_recipe(tmp_path / "fresh.yaml", tmp_path / "elsewhere",
                         **{"trainer.max_updates": 110})
    assert_ok(run_cli("train-sl", "--config", str(fresh), "--resume", str(anonymous),
                      "--set", f"trainer.output_dir={tmp_path / 'fresh'}", "--no-progress"))
    assert not (tmp_path / "elsewhere").exists()
    unchanged.check()
    new = run_json(tmp_path / "fresh")
    assert re.fullmatch(r"[0-9a-f]{32}", new["run_id"])
    assert new["resumed_from"] == {"run_id": None, "checkpoint": str(anonymous), "step": 100}
    last = read_checkpoint(tmp_path / "fresh" / "last.pt")
    assert last["manifest"]["run_id"] == new["run_id"] == last["payload"]["run"]["run_id"]
    assert last["manifest"]["step"] == 110


# -- the same refusals under torchrun: rank 0 decides and reports once ----------------------------


def _torchrun_cases(one: Path, two: Path, tmp: Path) -> dict[str, tuple[list[str], list[str],
                                                                         list[Path]]]:
    """name -> (command, expected texts, directories that must not change)."""
    dest = fresh_destination(tmp)
    cases: dict[str, tuple[list[str], list[str], list[Path]]] = {}
    # R-RESUME-2's differences are one list from one check (resume_policy.resume_problems):
    # one launch shows each of them refused, listed once, by rank 0 (the one-process tests
    # above show each alone).
    r = write_recipe(tmp / "cfg.yaml", dest, **{"model.hidden": 16, "data.seed": 99,
                                                "optimizer.lr": 0.002,
                                                "trainer.max_updates": 99})
    cases["world size, recipe, source, training config, max_updates lowered"] = (
        ["train-sl", "--config", str(r), "--resume", str(one / "step_100.pt")],
        ["world_size: checkpoint 1, this run 2", "model.hidden: checkpoint 32, this run 16",
         "data.seed: checkpoint 1234, this run 99",
         f"source identity: checkpoint {_identity(1234)}, this run {_identity(99)}",
         "optimizer.lr: checkpoint 0.001, this run 0.002",
         "trainer.max_updates: 99 is below the checkpoint's update 100"], [one, dest])
    other = _copy_run(two, tmp / "other")
    _set_run_id(other, "f" * 32)
    cases["in place, other run"] = (["resume", str(other)], [f"holds run {'f' * 32}"], [other])
    ahead = _copy_run(two, tmp / "ahead")
    r = write_recipe(tmp / "ahead.yaml", ahead)
    cases["in place, history ahead"] = (
        ["train-sl", "--config", str(r), "--resume", str(ahead / "step_100.pt")],
        ["already has records up to update 200"], [ahead])
    anonymous = _copy_run(two, tmp / "anonymous")
    rewrite_checkpoint(anonymous / "step_100.pt", anonymous / "step_100.pt", _no_identity)
    r = write_recipe(tmp / "anonymous.yaml", anonymous)
    cases["in place, no identity"] = (
        ["train-sl", "--config", str(r), "--resume", str(anonymous / "step_100.pt")],
        ["carries no run identity"], [anonymous])
    return cases


CASES = ["world size, recipe, source, training config, max_updates lowered",
         "in place, other run", "in place, history ahead", "in place, no identity"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_refusals_under_torchrun(sl_ddp_one_process: Path, sl_ddp_two_workers: Path,
                                 tmp_path: Path, case: str) -> None:
    command, expected, dirs = _torchrun_cases(sl_ddp_one_process, sl_ddp_two_workers,
                                              tmp_path)[case]
    unchanged = Unchanged(*dirs)
    proc = run_torchrun(*command, "--no-progress", timeout=GUARD)
    out = assert_refused_once(proc, *expected, torchrun=True)
    if case.startswith("in place"):
        assert len(FRESH_COMMAND.findall(workers_output(out))) == 1, out
    unchanged.check()
