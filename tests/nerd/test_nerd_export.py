"""NeRD's model exported by `embodichain export --policy` as a learned simulator step
(states, actions -> next state), run by the framework-free runner (R-DEPLOY-1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from embodichain_models.dynamics.nerd.prepare import main as prepare

from embodichain.core.deploy.runner import ArtifactError, PolicyRunner
from embodichain.core.deploy.trained import trained_model
from tests.support import assert_ok, run_cli
from tests.support.cli import invoke

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples/learning/nerd/configs/cartpole/sl.train.yaml"

pytestmark = pytest.mark.slow  # data, a short run and an ONNX export (~40 s)


def test_nerd_exports_as_a_learned_simulator_step(tmp_path: Path) -> None:
    """Catches a simulator-step artifact that returns the normalised Δstate, forgets θ's
    wrap, or takes another window: on the validation split's windows its next states equal
    the checkpoint model's `predict_next` within 1e-5 (float32), in both formats; and the
    runner refuses to execute it as a policy."""
    prepare(["--out", str(tmp_path), "--train-trajectories", "60", "--val-trajectories", "8",
             "--steps", "30"])
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe.update(factory="nerd", device="cpu")
    recipe["data"] = {"train": str(tmp_path / "train.pt"), "val": str(tmp_path / "val.pt")}
    recipe["trainer"].update(batch_size=32, max_updates=4, validate_every=0, save_every=4,
                             output_dir=str(tmp_path / "run"))
    recipe["validation"] = {"horizons": [1]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert_ok(run_cli("train-sl", "--config", str(tmp_path / "r.yaml"), "--no-progress"))

    model = trained_model(tmp_path / "run" / "last.pt").model
    window = model.cfg.window
    val = torch.load(tmp_path / "val.pt", weights_only=True)
    states = val["states"][:, :window].float().contiguous()
    actions = val["actions"][:, :window].float().contiguous()
    want = model.predict_next(states, actions).numpy()
    for fmt in ("onnx", "pt2"):
        out = tmp_path / f"nerd.{fmt}"
        result = invoke("export", str(tmp_path / "run"), "--policy", str(out))
        assert result.exit_code == 0, result.output
        assert "simulator_step" in result.stdout
        runner = PolicyRunner(out)
        assert runner.kind == "simulator_step"
        assert runner.interface["action"] == {
            "key": "next_state", "shape": [4], "dtype": "float32",
            "meaning": runner.interface["action"]["meaning"]}
        assert {k: v["shape"] for k, v in runner.interface["observations"].items()} == {
            "states": [window, 4], "actions": [window, 2]}
        got = runner.predict({"states": states.numpy(), "actions": actions.numpy()})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        with pytest.raises(ArtifactError, match="simulator_step, not a policy"):
            runner.act({"states": states.numpy(), "actions": actions.numpy()})
