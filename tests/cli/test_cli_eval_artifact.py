"""`embodichain eval ARTIFACT`: an exported policy judged in its run's environment, episode
for episode as its checkpoint is (R-DEPLOY-1, R-EVAL-1), on any number of processes
(R-EVAL-5); what cannot run is refused before any episode (R-EVAL-6).

One tiny linear policy for closed_loop's Reach (30 updates) is exported once and shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from embodichain.core.deploy.runner import ArtifactError, PolicyRunner
from tests.support import assert_ok, factories_env, run_cli
from tests.support.cli import invoke
from tests.support.files import doctored_artifact
from tests.support.recipes import CPU_RECIPE

pytestmark = pytest.mark.slow  # a training run and an export shared, eval in 2 workers

FACTORIES = Path(__file__).resolve().parents[1] / "factories"


@pytest.fixture(scope="module")
def reach(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The trained run and its ONNX artifact (3 evaluation episodes from seed 7)."""
    root = tmp_path_factory.mktemp("reach_artifact")
    recipe = yaml.safe_load(CPU_RECIPE.read_text())
    for key in ("model", "data"):
        recipe.pop(key)
    recipe["factory"] = "deploying:reach"
    recipe["trainer"].update({"max_updates": 30, "save_every": 30, "validate_every": 0,
                              "output_dir": str(root / "run")})
    recipe["optimizer"]["lr"] = 0.05
    recipe["evaluation"] = {"env": {"constructor": "closed_loop:make_reach"}, "episodes": 3,
                            "seed": 7, "max_steps": 12}
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert_ok(run_cli("train-sl", "--config", str(root / "r.yaml"), "--no-progress",
                      env=factories_env()))
    artifact = root / "policy.onnx"
    assert_ok(run_cli("export", str(root / "run"), "--policy", str(artifact),
                      env=factories_env()))
    return root / "run", artifact


def outcomes(directory: Path) -> list[tuple]:
    lines = (directory / "episodes.jsonl").read_text().splitlines()
    return [(r["episode"], r["seed"], r["success"], round(r["return"], 4), r["length"],
             r["end"]) for r in map(json.loads, lines)]


def test_eval_of_the_artifact_gives_the_checkpoints_outcomes(
        reach: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an artifact evaluated in another environment or with other seeds, a runner
    that acts differently from the checkpoint's policy (e.g. without the un-normalisation,
    or a stale chunk), and an `eval` that does not accept an artifact: on the same 3
    episodes both give the same success, return and length, episode by episode. Round 5's
    hand-made bug 12 (`eval ARTIFACT --nproc-per-node 2` silently running one process),
    and every rank running every episode into the same --out: with 2 workers the summary
    says world size 2 and each episode is there once, as in one process."""
    run, artifact = reach
    monkeypatch.syspath_prepend(str(FACTORIES))
    checkpoint = invoke("eval", str(run), "--out", str(tmp_path / "ckpt_eval"),
                        "--no-progress")
    assert checkpoint.exit_code == 0, checkpoint.output
    by_artifact = invoke("eval", str(artifact), "--out", str(tmp_path / "artifact_eval"),
                         "--no-progress")
    assert by_artifact.exit_code == 0, by_artifact.output

    want = outcomes(tmp_path / "ckpt_eval")
    assert len(want) == 3 and any(o[2] for o in want)  # the trained policy reaches
    assert outcomes(tmp_path / "artifact_eval") == want
    summary = json.loads((tmp_path / "artifact_eval" / "summary.json").read_text())
    assert summary["artifact"] == str(artifact) and summary["step"] == 30
    assert summary["world_size"] == 1

    two = tmp_path / "two_workers"
    assert_ok(run_cli("eval", str(artifact), "--out", str(two), "--nproc-per-node", "2",
                      "--no-progress", env=factories_env()))
    assert outcomes(two) == want
    assert json.loads((two / "summary.json").read_text())["world_size"] == 2

    refused = invoke("eval", str(artifact), "--ema")
    assert refused.exit_code == 2 and "no --ema" in refused.stderr


def refused(*args: str) -> str:
    """`eval ARGS` run as a user runs it: exit 2, one line, no traceback; the line."""
    proc = run_cli("eval", *args, "--no-progress", env=factories_env())
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_a_damaged_or_foreign_file_is_refused_by_name(reach: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """R-EVAL-6: a truncated .onnx, bytes that are no torch.export program named .pt2, and
    an ONNX model that no export wrote (no interface) are refused in one line (exit 2)
    by eval and by the runner (ArtifactError), not with onnxruntime's InvalidProtobuf or
    zipfile's BadZipFile (exit 1)."""
    import onnx
    from onnx import TensorProto, helper

    _, artifact = reach
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(artifact.read_bytes()[:300])
    not_a_program = tmp_path / "policy.pt2"
    not_a_program.write_bytes(b"not a zip archive at all")
    foreign = tmp_path / "foreign.onnx"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])],
                                                  "g", [x], [helper.make_tensor_value_info(
                                                      "y", TensorProto.FLOAT, [1])])),
              str(foreign))
    for path, says in ((truncated, "is not an ONNX model onnxruntime can load"),
                       (not_a_program, "is not a torch.export program torch can load"),
                       (foreign, "carries no embodichain interface")):
        line = refused(str(path), "--out", str(tmp_path / "out"))
        assert str(path) in line and says in line, line
        with pytest.raises(ArtifactError, match=says):
            PolicyRunner(path)
    assert not (tmp_path / "out").exists()


def test_without_onnxruntime_the_deploy_extra_is_named(reach: tuple[Path, Path]) -> None:
    """R-EVAL-6: `eval policy.onnx` where onnxruntime cannot be imported exits 2 naming the
    extra that installs it, not ModuleNotFoundError (exit 1)."""
    _, artifact = reach
    script = ("import sys; sys.modules['onnxruntime'] = None; "
              "from embodichain.cli import main; sys.argv = ['embodichain', *sys.argv[1:]]; "
              "main()")
    proc = subprocess.run([sys.executable, "-c", script, "eval", str(artifact)],
                          capture_output=True, text=True, timeout=120, env=factories_env())
    assert proc.returncode == 2, proc.stderr
    assert "onnxruntime" in proc.stderr and "embodichain-sl[deploy]" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_artifact_that_cannot_run_there_is_refused_before_any_episode(
        reach: tuple[Path, Path], tmp_path: Path) -> None:
    """R-EVAL-6, each refused (exit 2, one line) with nothing written to --out:

    - round 5's hand-made bug 9: an interface declaring a chunk of 2 for a model that gives
      1 action (a Horizon would execute the short chunk as whole, exit 0);
    - round 5's hand-made bug 11: an environment observing float64 where the policy takes
      float32 (exit 1 at the first step instead);
    - seeds among the demonstration seeds the artifact records (7..9 over seed 8), which
      another --seed then evaluates."""
    _, artifact = reach

    def longer_chunk(i: dict) -> None:
        i["chunk"], i["action"]["shape"] = 2, [2, 1]

    def float64_env(i: dict) -> None:
        i["evaluation"]["env"]["kwargs"] = {"dtype": "float64"}

    def recorded_seed(i: dict) -> None:
        i["provenance"]["demonstration_seeds"] = [8]

    cases = {"chunk.onnx": (longer_chunk, ["declares [batch, *[2, 1]]"]),
             "float64.onnx": (float64_env, ["float64", "float32"]),
             "seeds.onnx": (recorded_seed, ["evaluation seeds 7..9", "(8)"])}
    for name, (change, says) in cases.items():
        path = doctored_artifact(artifact, tmp_path / name, change)
        line = refused(str(path), "--out", str(tmp_path / "out"))
        assert all(s in line for s in says), line
        assert not (tmp_path / "out").exists()
    assert_ok(run_cli("eval", str(tmp_path / "seeds.onnx"), "--seed", "100", "--out",
                      str(tmp_path / "out"), "--no-progress", env=factories_env()))
    assert [o[1] for o in outcomes(tmp_path / "out")] == [100, 101, 102]
