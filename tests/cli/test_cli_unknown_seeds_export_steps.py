"""One tiny run of demonstrations whose seeds are unknown, exported once, for two things:

- evaluation seeds that cannot be checked against the demonstrations' seeds, because the
  data does not say them (an ALOHA dataset copied without meta/aloha.json), are never
  passed in silence (R-EVAL-6): training warns naming the file, the checkpoint keeps it,
  and `eval` of the checkpoint or of its exported policy warns and records it in
  summary.json;
- `export --policy` names each of its steps as it begins (R-UX-1: tracing, converting and
  checking a large model take minutes), and `--no-progress` shows none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import assert_ok, factories_env, run_cli
from tests.support.cli import invoke
from tests.support.processes import FACTORIES
from tests.support.recipes import CPU_RECIPE

MISSING = "/data/reach_demos/meta/seeds.json is missing"  # tests/factories/unknown_seeds.py


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Path, str]:
    """The run (2 episodes from seed 7), train-sl's stderr, its ONNX artifact and what
    `export --policy` printed."""
    root = tmp_path_factory.mktemp("unknown_seeds")
    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    for key in ("model", "data"):
        recipe.pop(key)
    recipe["factory"] = "unknown_seeds:reach"
    recipe["trainer"].update({"max_updates": 2, "save_every": 2, "validate_every": 0,
                              "output_dir": str(root / "run")})
    recipe["evaluation"] = {"env": {"constructor": "closed_loop:make_reach"}, "episodes": 2,
                            "seed": 7, "max_steps": 4}
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    trained = run_cli("train-sl", "--config", str(root / "r.yaml"), "--no-progress",
                      env=factories_env())
    assert_ok(trained)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FACTORIES))  # the checkpoint names the factory's module
        done = invoke("export", str(root / "run"), "--policy", str(root / "policy.onnx"))
    assert done.exit_code == 0, done.output
    return root / "run", trained.stderr, root / "policy.onnx", done.output


def test_unknown_demonstration_seeds_are_warned_about_and_recorded_in_the_summary(
        exported: tuple[Path, str, Path, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: the check skipped silently when the seeds are unknown (no warning at
    training's start, or at `eval`), the checkpoint or the artifact's provenance dropping
    the fact (a later `eval` then passes in silence), and a summary.json that does not
    record it."""
    run, trained, artifact, _ = exported
    assert MISSING in trained and "evaluation seeds 7..8 were not checked" in trained, trained
    monkeypatch.syspath_prepend(str(FACTORIES))
    checked = invoke("eval", str(run), "--seed", "20", "--out", str(tmp_path / "ckpt_eval"),
                     "--no-progress")
    assert checked.exit_code == 0, checked.output
    assert MISSING in checked.output and "seeds 20..21 were not checked" in checked.output
    summary = json.loads((tmp_path / "ckpt_eval" / "summary.json").read_text())
    assert summary["demonstration_seeds_unknown"] == MISSING

    by_artifact = invoke("eval", str(artifact), "--out", str(tmp_path / "artifact_eval"),
                         "--no-progress")
    assert by_artifact.exit_code == 0, by_artifact.output
    assert MISSING in by_artifact.output, by_artifact.output
    summary = json.loads((tmp_path / "artifact_eval" / "summary.json").read_text())
    assert summary["demonstration_seeds_unknown"] == MISSING


def test_export_names_each_step_as_it_begins_unless_no_progress(
        exported: tuple[Path, str, Path, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches: an export silent for the minutes it traces, converts and checks, steps
    named out of order or miscounted, and progress shown under --no-progress."""
    run, _, _, printed = exported
    steps = [line.split(":")[0] for line in printed.splitlines() if " steps  elapsed " in line]
    assert steps == ["reading the checkpoint and rebuilding its model",
                     "tracing the deployable forward (torch.export)", "writing the onnx artifact",
                     "checking the artifact against the model"], printed
    assert "checking the artifact against the model: 3/4 steps" in printed
    monkeypatch.syspath_prepend(str(FACTORIES))
    quiet = invoke("export", str(run), "--policy", str(tmp_path / "p.pt2"), "--no-progress")
    assert quiet.exit_code == 0, quiet.output
    assert " steps  elapsed " not in quiet.output and "wrote" in quiet.output
