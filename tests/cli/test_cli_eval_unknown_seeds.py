"""Evaluation seeds that cannot be checked against the demonstrations' seeds, because the
data does not say them (an ALOHA dataset copied without meta/aloha.json), are never passed
in silence (R-EVAL-6): training warns naming the file, the checkpoint keeps it, and `eval`
of the checkpoint or of its exported policy warns and records it in summary.json.

Catches: the check skipped silently when the seeds are unknown (no warning at training's
start, or at `eval`), the checkpoint or the artifact's provenance dropping the fact (a
later `eval` then passes in silence), and a summary.json that does not record it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import assert_ok, factories_env, run_cli
from tests.support.cli import invoke
from tests.support.processes import FACTORIES
from tests.support.recipes import CPU_RECIPE


def test_unknown_demonstration_seeds_are_warned_about_and_recorded_in_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FACTORIES))  # the checkpoint names the factory's module
    from unknown_seeds import MISSING  # tests/factories

    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    for key in ("model", "data"):
        recipe.pop(key)
    recipe["factory"] = "unknown_seeds:reach"
    recipe["trainer"].update({"max_updates": 2, "save_every": 2, "validate_every": 0,
                              "output_dir": str(tmp_path / "run")})
    recipe["evaluation"] = {"env": {"constructor": "closed_loop:make_reach"}, "episodes": 2,
                            "seed": 7, "max_steps": 4}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    trained = run_cli("train-sl", "--config", str(tmp_path / "r.yaml"), "--no-progress",
                      env=factories_env())
    assert_ok(trained)
    assert MISSING in trained.stderr and "evaluation seeds 7..8 were not checked" \
        in trained.stderr, trained.stderr

    checked = invoke("eval", str(tmp_path / "run"), "--seed", "20", "--out",
                     str(tmp_path / "ckpt_eval"), "--no-progress")
    assert checked.exit_code == 0, checked.output
    assert MISSING in checked.output and "seeds 20..21 were not checked" in checked.output
    summary = json.loads((tmp_path / "ckpt_eval" / "summary.json").read_text())
    assert summary["demonstration_seeds_unknown"] == MISSING

    artifact = tmp_path / "policy.onnx"
    exported = invoke("export", str(tmp_path / "run"), "--policy", str(artifact))
    assert exported.exit_code == 0, exported.output
    by_artifact = invoke("eval", str(artifact), "--out", str(tmp_path / "artifact_eval"),
                         "--no-progress")
    assert by_artifact.exit_code == 0, by_artifact.output
    assert MISSING in by_artifact.output, by_artifact.output
    summary = json.loads((tmp_path / "artifact_eval" / "summary.json").read_text())
    assert summary["demonstration_seeds_unknown"] == MISSING
