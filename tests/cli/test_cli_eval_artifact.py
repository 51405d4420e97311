"""`embodichain eval ARTIFACT`: an exported policy judged in its run's environment, episode
for episode as its checkpoint is (R-DEPLOY-1, R-EVAL-1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.support import assert_ok, factories_env, run_cli
from tests.support.cli import invoke
from tests.support.recipes import CPU_RECIPE

FACTORIES = Path(__file__).resolve().parents[1] / "factories"


def test_eval_of_the_artifact_gives_the_checkpoints_outcomes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an artifact evaluated in another environment or with other seeds, a runner
    that acts differently from the checkpoint's policy (e.g. without the un-normalisation,
    or a stale chunk), and an `eval` that does not accept an artifact: on the same 3
    episodes both give the same success, return and length, episode by episode."""
    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    for key in ("model", "data"):
        recipe.pop(key)
    recipe["factory"] = "deploying:reach"
    recipe["trainer"].update({"max_updates": 30, "save_every": 30, "validate_every": 0,
                              "output_dir": str(tmp_path / "run")})
    recipe["optimizer"]["lr"] = 0.05
    recipe["evaluation"] = {"env": {"constructor": "closed_loop:make_reach"}, "episodes": 3,
                            "seed": 7, "max_steps": 12}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert_ok(run_cli("train-sl", "--config", str(tmp_path / "r.yaml"), "--no-progress",
                      env=factories_env()))
    monkeypatch.syspath_prepend(str(FACTORIES))
    artifact = tmp_path / "policy.onnx"
    exported = invoke("export", str(tmp_path / "run"), "--policy", str(artifact))
    assert exported.exit_code == 0, exported.output

    checkpoint = invoke("eval", str(tmp_path / "run"), "--out", str(tmp_path / "ckpt_eval"),
                        "--no-progress")
    assert checkpoint.exit_code == 0, checkpoint.output
    by_artifact = invoke("eval", str(artifact), "--out", str(tmp_path / "artifact_eval"),
                         "--no-progress")
    assert by_artifact.exit_code == 0, by_artifact.output

    def outcomes(directory: Path) -> list[tuple]:
        lines = (directory / "episodes.jsonl").read_text().splitlines()
        return [(r["episode"], r["seed"], r["success"], round(r["return"], 4), r["length"],
                 r["end"]) for r in map(json.loads, lines)]

    want = outcomes(tmp_path / "ckpt_eval")
    assert len(want) == 3 and any(o[2] for o in want)  # the trained policy reaches
    assert outcomes(tmp_path / "artifact_eval") == want
    summary = json.loads((tmp_path / "artifact_eval" / "summary.json").read_text())
    assert summary["artifact"] == str(artifact) and summary["step"] == 30

    refused = invoke("eval", str(artifact), "--ema")
    assert refused.exit_code == 2 and "no --ema" in refused.stderr
