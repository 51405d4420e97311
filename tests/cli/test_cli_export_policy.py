"""`embodichain export --policy`: a trained policy as one ONNX / `.pt2` artifact that acts
like its checkpoint, run by `embodichain.core.deploy.runner` (R-DEPLOY-1, issue 44).

One tiny cart-pole behaviour-cloning run (32x32 camera, 6 episodes, 8 updates) is exported
in both formats once and shared by the tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from embodichain_models.data.cartpole.prepare import IMAGE_KEY, prepare
from embodichain_models.data.lerobot.dataset import LeRobotFrames

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.deploy.runner import (
    ArtifactError,
    ObservationError,
    PolicyRunner,
    read_interface,
)
from tests.support import assert_ok, factories_env, run_cli, run_torchrun, write_recipe
from tests.support.cli import export_deploying, invoke

pytestmark = pytest.mark.slow  # a recorded dataset, a training run and two exports (~1 min)

OBSERVATIONS = 1000
STEPS = 60  # of each closed-loop episode
TOLERANCE = 1e-5  # float32: |artifact - checkpoint| <= 1e-5 * (1 + |checkpoint|)


@pytest.fixture(scope="module")
def bc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cart-pole policy trained for 8 updates on 6 recorded episodes."""
    root = tmp_path_factory.mktemp("bc_export")
    assert invoke("init", "cartpole_bc", str(root / "packaged.yaml")).exit_code == 0
    data = prepare(root / "data", episodes=6, seed=0, size=32)
    recipe = yaml.safe_load((root / "packaged.yaml").read_text())
    recipe["device"] = "cpu"
    # global 24 = 3 x 8 on one rank: a world of 2 cannot train it (eval must not care)
    recipe["trainer"].update({"batch_size": 8, "global_batch_size": 24, "max_updates": 8,
                              "save_every": 8, "validate_every": 0, "log_every": 8,
                              "data_workers": 0, "output_dir": str(root / "run")})
    recipe["model"] = {"channels": 8, "hidden": 32}
    recipe["data"].update(root=str(data), val_episodes=2, chunk=4)
    recipe["validation"] = {"max_examples": 32, "execute": 2}
    recipe["evaluation"].update(episodes=2, max_steps=STEPS, envs_per_rank=2, videos=0)
    recipe["evaluation"]["env"]["kwargs"]["size"] = 32
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert_ok(run_cli("train-sl", "--config", str(root / "r.yaml"), "--no-progress"))
    return root / "run"


@pytest.fixture(scope="module")
def artifacts(bc_run: Path) -> dict[str, Path]:
    out = {}
    for fmt in ("onnx", "pt2"):
        path = bc_run.parent / f"policy.{fmt}"
        result = invoke("export", str(bc_run), "--policy", str(path), "--format", fmt)
        assert result.exit_code == 0, result.output
        assert f"wrote {path}" in result.stdout and "update 8" in result.stdout
        out[fmt] = path
    return out


@pytest.fixture(scope="module")
def checkpoint_model(bc_run: Path) -> torch.nn.Module:
    """The checkpoint's policy, built as its factory builds it, with its saved weights."""
    from embodichain.core.deploy.trained import trained_model

    model = trained_model(bc_run / "last.pt").model
    saved = read_checkpoint(bc_run / "last.pt")["payload"]["learner"]["model"]
    assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)
    return model


@pytest.fixture(scope="module")
def recorded(bc_run: Path) -> dict[str, np.ndarray]:
    """1000 observations recorded in the dataset (evenly spaced over its frames): the last
    2 camera frames as the dataset decodes them (float, k / 255) and the state."""
    frames = LeRobotFrames(bc_run.parent / "data", features=[IMAGE_KEY, "observation.state"],
                           delta_timestamps={IMAGE_KEY: [-1 / 30, 0.0]})
    picks = np.linspace(0, len(frames) - 1, OBSERVATIONS).round().astype(int)
    examples = [frames[int(i)] for i in picks]
    return {key: torch.stack([e[key] for e in examples]).numpy()
            for key in (IMAGE_KEY, "observation.state")}


def as_camera_gives(recorded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The recorded frames as the camera gives them (uint8), under the policy's keys."""
    pixels = np.round(recorded[IMAGE_KEY] * 255).astype(np.uint8)
    assert np.array_equal(pixels.astype(np.float32) / 255, recorded[IMAGE_KEY])
    return {"image": pixels, "state": recorded["observation.state"]}


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_artifact_acts_like_the_checkpoint(fmt: str, artifacts: dict[str, Path],
                                           checkpoint_model: torch.nn.Module,
                                           recorded: dict[str, np.ndarray],
                                           bc_run: Path) -> None:
    """Catches an artifact without the normalisation baked in (its output would be the
    normalised chunk), with other weights (an update other than the checkpoint's, or the
    EMA's), a chunk of the wrong shape, or an interface that is missing or not the
    policy's: on 1000 recorded observations its actions equal the checkpoint's within 1e-5
    (float32), and the interface read back names keys, shapes, execution and provenance."""
    runner = PolicyRunner(artifacts[fmt])
    got = runner.predict(as_camera_gives(recorded))
    with torch.no_grad():
        want = checkpoint_model.forces(torch.from_numpy(recorded[IMAGE_KEY]),
                                       torch.from_numpy(recorded["observation.state"]))
    assert got.shape == (OBSERVATIONS, 4, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got[..., 0], want.numpy(), rtol=TOLERANCE, atol=TOLERANCE)

    interface = read_interface(artifacts[fmt])
    assert interface == runner.interface
    assert {k: (v["shape"], v["dtype"], v.get("stack")) for k, v in
            interface["observations"].items()} == {"image": ([3, 32, 32], "uint8", 2),
                                                    "state": ([4], "float32", None)}
    assert all(v["meaning"] for v in interface["observations"].values())
    assert interface["action"]["key"] == "action" and interface["action"]["shape"] == [4, 1]
    assert (interface["fps"], interface["chunk"], interface["execution"]) == \
        (30, 4, {"horizon": 2})
    run = json.loads((bc_run / "run.json").read_text())
    ckpt = read_checkpoint(bc_run / "last.pt")["payload"]["run"]
    provenance = interface["provenance"]
    assert provenance["run_id"] == run["run_id"] == ckpt["run_id"]
    assert provenance["update"] == 8 and provenance["weights"] == "model"
    assert provenance["recipe_sha256"] == ckpt["config_sha256"]
    assert provenance["packages"]["torch"] == torch.__version__


def test_wrong_observation_is_refused_by_name(artifacts: dict[str, Path],
                                              recorded: dict[str, np.ndarray]) -> None:
    """Catches a runner that casts, broadcasts or ignores what does not fit the interface
    (a robot would act on garbage): a missing or unknown key, float frames where the camera
    gives uint8, a float64 state and a wrong shape are each refused naming the key and
    what differs."""
    runner = PolicyRunner(artifacts["onnx"])
    one = {k: v[:3] for k, v in as_camera_gives(recorded).items()}
    step = {"image": one["image"][:, -1], "state": one["state"]}  # one step: the last frame
    cases = [({"image": step["image"]}, "missing ['state']"),
             ({**step, "velocity": step["state"]}, "unknown ['velocity']"),
             ({**step, "image": step["image"].astype(np.float32) / 255},
              "'image': dtype float32, the policy takes uint8"),
             ({**step, "state": step["state"].astype(np.float64)},
              "'state': dtype float64, the policy takes float32"),
             ({**step, "image": one["image"]},
              "'image': shape [3, 2, 3, 32, 32], the policy takes [3, 32, 32]")]
    for observations, named in cases:
        with pytest.raises(ObservationError, match=named.replace("[", r"\[")):
            runner.act(observations)
    runner.reset()
    assert runner.act({k: v[0] for k, v in step.items()}).shape == (1,)  # unbatched
    assert runner.predict({k: v[0] for k, v in one.items()}).shape == (4, 1)


def test_closed_loop_outcomes_equal_the_checkpoints(artifacts: dict[str, Path],
                                                    bc_run: Path) -> None:
    """Catches a runner whose chunk execution or frame stacking differs from the
    checkpoint's closed loop (e.g. every chunk's first action only, the horizon counted
    from another step, frames not repeated at an episode's start, or a slot's history kept
    across its reset), and an `eval` that does not take an artifact: in the simulated
    cart-pole (the recipe's evaluation: 2 episodes from its seeds, 2 slots), both formats
    give the checkpoint's success, return and length, episode by episode."""
    def outcomes(directory: Path) -> list[tuple]:
        lines = (directory / "episodes.jsonl").read_text().splitlines()
        return [(r["episode"], r["seed"], r["success"], round(r["return"], 3), r["length"],
                 r["end"]) for r in map(json.loads, lines)]

    root = bc_run.parent
    result = invoke("eval", str(bc_run), "--out", str(root / "eval_ckpt"), "--no-progress")
    assert result.exit_code == 0, result.output
    want = outcomes(root / "eval_ckpt")
    assert len(want) == 2 and all(o[4] == STEPS for o in want)
    for fmt, path in artifacts.items():
        out = root / f"eval_{fmt}"
        result = invoke("eval", str(path), "--out", str(out), "--no-progress")
        assert result.exit_code == 0, result.output
        assert outcomes(out) == want, fmt


def test_inputs_in_another_order_than_the_interface_are_refused(
        artifacts: dict[str, Path], tmp_path: Path) -> None:
    """Round 5's hand-made bug 10: an ONNX artifact whose inputs are in another order than
    its interface names them (state, image) accepted because only their count is compared
    (the state would be fed into the image slot). The runner refuses it naming both
    orders, and `eval` exits 2."""
    from tests.support.files import doctored_artifact

    def swapped(interface: dict) -> None:
        interface["observations"] = dict(reversed(interface["observations"].items()))

    path = doctored_artifact(artifacts["onnx"], tmp_path / "swapped.onnx", swapped)
    with pytest.raises(ArtifactError, match=r"inputs \['image', 'state'\] are not its "
                                            r"interface's observations \['state', 'image'\]"):
        PolicyRunner(path)
    result = invoke("eval", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "in that order" in result.stderr, result.output
    assert not (tmp_path / "out").exists()


def test_eval_and_export_need_only_the_checkpoint(bc_run: Path, artifacts: dict[str, Path],
                                                  tmp_path: Path) -> None:
    """R-EVAL-5: with the training dataset moved away and the checkpoint copied to another
    directory (the cwd), `eval` gives the outcomes it gave with the data, in 2 workers (a
    world the recipe's global batch of 24 = 3 x 8 cannot train on: a training-only rule;
    the summary names that world size, it said 1), and `export --policy` writes the
    artifact the run's directory gave. Catches a factory that reads its dataset when
    rebuilt to act (exit 2 "LeRobot dataset not found"), facts not recorded in the
    checkpoint, and an eval that builds the training sampler (refusing the world of 2)."""
    want = invoke("eval", str(bc_run), "--out", str(tmp_path / "with_data"), "--no-progress")
    assert want.exit_code == 0, want.output
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checkpoint = elsewhere / "policy_update_8.pt"
    shutil.copyfile(bc_run / "last.pt", checkpoint)
    data = bc_run.parent / "data"
    data.rename(bc_run.parent / "data_gone")
    try:
        assert_ok(run_cli("eval", checkpoint.name, "--out", str(tmp_path / "two"),
                          "--no-progress", "--nproc-per-node", "2", cwd=elsewhere))
        # One process acts for both episodes in one batched forward, two workers for one
        # each: the policy's float32 matmuls sum in another order for another batch size
        # (1e-10 apart here), so the returns agree to a tight tolerance, the rest exactly.
        two, one = outcomes(tmp_path / "two"), outcomes(tmp_path / "with_data")
        assert [o[:3] + o[4:] for o in two] == [o[:3] + o[4:] for o in one]
        assert [o[3] for o in two] == pytest.approx([o[3] for o in one], rel=1e-6, abs=1e-9)
        assert json.loads((tmp_path / "two" / "summary.json").read_text())["world_size"] == 2
        assert_ok(run_cli("export", checkpoint.name, "--policy", "p.onnx", cwd=elsewhere))
    finally:
        (bc_run.parent / "data_gone").rename(data)
    sample = {"image": np.random.default_rng(0).integers(0, 256, (5, 2, 3, 32, 32), np.uint8),
              "state": np.random.default_rng(1).standard_normal((5, 4), np.float32)}
    np.testing.assert_array_equal(PolicyRunner(elsewhere / "p.onnx").predict(sample),
                                  PolicyRunner(artifacts["onnx"]).predict(sample))


def outcomes(directory: Path) -> list[tuple]:
    lines = (directory / "episodes.jsonl").read_text().splitlines()
    return [(r["episode"], r["seed"], r["success"], r["return"], r["length"], r["end"])
            for r in map(json.loads, lines)]


def test_unexportable_model_is_refused_naming_the_operation(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Catches an export that writes a broken artifact, crashes with a traceback, or exits
    1: a deployable forward that branches on a tensor's value (`.item()`) is refused with
    exit 2 naming that line, and nothing is written."""
    out = tmp_path / "policy.onnx"
    result = export_deploying(tmp_path, "branching", out, monkeypatch)
    assert result.exit_code == 2, result.output
    assert "cannot be exported" in result.stderr
    assert "`if y.sum().item() > 0:" in result.stderr and "deploying.py" in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".policy")]


def test_a_forward_shorter_than_its_declared_chunk_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 5's hand-made bug 9 at export: a deployable forward giving 3 actions where its
    interface() declares a chunk of 4 was published (the artifact and the eager model agree
    with each other), and a runner would execute the short chunk as if whole. Refused (exit
    2) naming both shapes; nothing written."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{"factory": "deploying:short", "trainer.max_updates": 1,
                             "trainer.save_every": 1})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env()))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "factories"))
    out = tmp_path / "policy.onnx"
    result = invoke("export", str(tmp_path / "run"), "--policy", str(out))
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "returns [2, 3, 2] for a batch of 2" in said and "says [2, 4, 2]" in said
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_an_artifact_that_computes_something_else_is_not_published(
        fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches `export --policy`'s check against the eager model comparing shapes only (an
    artifact that computes something else published as "checked"): a deployable forward
    whose traced graph scales the chunk by 1.01 (same shape) is refused, exit 2, with the
    largest difference named, and nothing is written."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{"factory": "deploying:drifting", "trainer.max_updates": 1,
                             "trainer.save_every": 1})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress",
                      env=factories_env()))
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "factories"))
    out = tmp_path / f"policy.{fmt}"
    result = invoke("export", str(tmp_path / "run"), "--policy", str(out))
    assert result.exit_code == 2, result.output
    assert "does not act like the model" in result.stderr
    assert "largest difference" in result.stderr and "inf" not in result.stderr
    assert "Traceback" not in result.stderr and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".policy")]


def test_a_model_without_deployable_forward_is_refused(tmp_path: Path) -> None:
    """Catches an export of the training model itself (the objective's forward) when the
    factory declares nothing: sl_ddp's model has no deployable() and is refused, exit 2."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{"trainer.max_updates": 1, "trainer.save_every": 1})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    out = tmp_path / "policy.pt2"
    result = invoke("export", str(tmp_path / "run"), "--policy", str(out))
    assert result.exit_code == 2, result.output
    assert "declares no deployable forward" in result.stderr and "deployable()" in result.stderr
    assert not out.exists()
    both = invoke("export", str(tmp_path / "run"), str(tmp_path / "m.pt"), "--policy", str(out))
    assert both.exit_code == 2 and "one of them" in both.stderr


def test_a_sharded_checkpoint_exports_its_consolidated_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a policy export that reads one shard (half the rows), refuses a sharded
    manifest, or needs torchrun: an fsdp run of 2 workers exports in one process, and the
    artifact computes with the consolidated weights."""
    from embodichain.core.checkpoint.sharded import consolidated_model

    out = tmp_path / "policy.pt2"
    result = export_deploying(tmp_path, "chunked", out, monkeypatch, launch=run_torchrun,
                              **{"trainer.strategy": "fsdp", "trainer.validate_every": 0})
    assert result.exit_code == 0, result.output

    manifest = tmp_path / "run" / "last.pt"
    whole = consolidated_model(manifest, read_checkpoint(manifest))
    model = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    model.load_state_dict(whole)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = model(x)
    want = torch.stack([y + 0.25 * i for i in range(3)], dim=1).numpy()
    np.testing.assert_allclose(PolicyRunner(out).predict({"x": x.numpy()}), want,
                               rtol=TOLERANCE, atol=TOLERANCE)


def test_ema_policy_of_a_run_without_ema_is_refused(bc_run: Path) -> None:
    """Catches `--policy --ema` silently exporting the model's own weights when the run kept
    no EMA: refused (exit 2) saying so, nothing written."""
    out = bc_run.parent / "ema.onnx"
    result = invoke("export", str(bc_run), "--policy", str(out), "--ema")
    assert result.exit_code == 2, result.output
    assert "holds no EMA weights" in result.stderr and not out.exists()
