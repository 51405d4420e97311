"""A resume writes nothing until every rank has loaded its state (R-PREEMPT-2).

The factory is tests/factories/renaming.py: release 0.1 names its output layer `head`,
release 0.2 (EMBODICHAIN_TEST_RENAMED) `action_head`. A run trained by 0.1 is resumed by
0.2: the state does not load, so the resume is refused (exit 2) naming the missing and
unexpected tensors and the factory's version in the checkpoint and now, and the run
directory is byte-identical afterwards: run.json (no `resumed` event, no `rolled_back`),
metrics.jsonl (its records beyond the snapshot not moved), the lock file, and what `runs`
says of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support import assert_ok, factories_env, run_cli, run_torchrun, write_recipe

SMALL = {"factory": "renaming:build_supervised_trainer", "trainer.batch_size": 8,
         "trainer.max_updates": 8, "trainer.save_every": 4, "trainer.validate_every": 0,
         "trainer.log_every": 1, "model.hidden": 8, "data.train_size": 256,
         "data.val_size": 64}
OLD, NEW = factories_env(), factories_env(EMBODICHAIN_TEST_RENAMED="1")
KEPT = ("run.json", "metrics.jsonl", ".lock")


def _state(run: Path) -> dict[str, bytes]:
    """The bytes of every file a resume may write, and what `runs` says of the run."""
    files = {name: (run / name).read_bytes() for name in KEPT}
    shown = run_cli("runs", str(run.parent), "--json")
    assert_ok(shown)
    return {**files, "runs": shown.stdout.encode()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Release 0.1's run, on one process and on two ranks, to update 8; step_8.pt and last.pt
    removed, so that a resume continues from step_4.pt and would roll back the records of
    updates 5..8."""
    root = tmp_path_factory.mktemp("renaming")
    runs = {}
    for ranks in (1, 2):
        run = root / f"run{ranks}"
        recipe = write_recipe(root / f"r{ranks}.yaml", run, **SMALL)
        args = ("train-sl", "--config", str(recipe), "--no-progress")
        assert_ok(run_cli(*args, env=OLD) if ranks == 1 else run_torchrun(*args, env=OLD))
        for name in ("step_8.pt", "last.pt"):
            (run / name).unlink()
        runs[ranks] = run
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_renamed_module_is_refused_before_anything_is_written(trained: dict[int, Path],
                                                                ranks: int) -> None:
    """Catches a resume that records itself (roll-back, `resumed` event) before the ranks
    have loaded (then `runs` calls the run "interrupted"), torch's raw load_state_dict
    error (exit 1) instead of a refusal naming the tensors, a refusal without the factory's
    versions, and, on two ranks, a rank that writes while another could not load."""
    run = trained[ranks]
    before = _state(run)
    args = ("resume", str(run), "--no-progress")
    proc = run_cli(*args, env=NEW) if ranks == 1 else run_torchrun(*args, env=NEW)
    output = proc.stdout + proc.stderr
    if ranks == 1:
        assert proc.returncode == 2, output
    else:  # torchrun exits 1 and names each worker's exit code
        assert proc.returncode == 1 and "exitcode  : 2" in proc.stderr, output
    assert "missing from the checkpoint (2): action_head.bias, action_head.weight" in output
    assert "unexpected (in the checkpoint, not in the model) (2): head.bias, head.weight" \
        in output
    assert "renaming 0.1 (now 0.2)" in output and "step_4.pt" in output, output
    assert "Nothing was changed" in output
    assert ("Traceback" not in output) if ranks == 1 else \
        output.count("error: cannot resume from") == 1  # rank 0 says it, once
    assert _state(run) == before
    assert not list(run.glob("metrics.rolled_back.*"))


def test_the_same_release_resumes_and_records_its_versions(trained: dict[int, Path],
                                                           tmp_path: Path) -> None:
    """Catches a `resumed` event without the versions its stretch ran with (the factory's
    own included), and the agreement step refusing a resume that loads."""
    run = tmp_path / "run"
    shutil.copytree(trained[1], run)
    assert_ok(run_cli("resume", str(run), "--no-progress", env=OLD))
    identity = json.loads((run / "run.json").read_text())
    resumed = [e for e in identity["events"] if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == 4
    assert [e["event"] for e in identity["events"]][-2:] == ["rolled_back", "resumed"]
    assert resumed[0]["versions"]["renaming"] == "0.1"
    assert set(resumed[0]["versions"]) >= {"python", "torch", "embodichain", "renaming"}
