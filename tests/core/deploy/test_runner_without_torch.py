"""`embodichain.core.deploy.runner` on an ONNX artifact in a virtual environment holding
only onnxruntime and numpy (no torch, no embodichain installed, no embodichain_models): the
robot's computer (R-DEPLOY-1, R-LAYER-1). The runner is taken from the source tree; importing
it may load only its parent packages, which import nothing.

The environment is made once (pip, from the package index) and cached beside pytest's
temporary directories, keyed by the two versions this test environment has, behind a file
lock (parallel workers wait for one install) and a time limit."""

from __future__ import annotations

import fcntl
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.support.cli import export_deploying

pytestmark = pytest.mark.slow  # a venv made by pip on the first run (~1 min), then cached

ROOT = Path(__file__).resolve().parents[3]
INSTALL_TIMEOUT = 600
STEPS, M = 6, 0.5


def torch_free_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv's python holding onnxruntime and numpy only (made once, then reused)."""
    versions = {name: importlib.metadata.version(name) for name in ("onnxruntime", "numpy")}
    root = tmp_path_factory.getbasetemp()
    while not root.name.startswith("pytest-of-") and root.parent != root:
        root = root.parent  # above the session's directory: kept across runs
    if root.parent == root:
        root = tmp_path_factory.getbasetemp()
    tag = "-".join(f"{k}{v}" for k, v in versions.items())
    venv = root / f"embodichain-torch-free-{tag}"
    python = venv / "bin" / "python"
    with open(root / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / "complete").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                           timeout=120)
            subprocess.run([str(python), "-m", "pip", "install", "-q",
                            "--disable-pip-version-check",
                            *(f"{k}=={v}" for k, v in versions.items())],
                           check=True, timeout=INSTALL_TIMEOUT)
            (venv / "complete").write_text(json.dumps(versions))
    return python


SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    import numpy as np
    assert importlib.util.find_spec("torch") is None, "torch is installed here"
    assert importlib.util.find_spec("embodichain") is None, "embodichain is installed here"
    sys.path.insert(0, sys.argv[1])
    from embodichain.core.deploy.runner import ObservationError, PolicyRunner
    runner = PolicyRunner(sys.argv[2])
    x = np.load(sys.argv[3])
    runner.reset()
    actions = []
    for t in range(len(x)):
        if t == 3:
            runner.reset(1)  # slot 1 starts a new episode
        actions.append(runner.act({"x": x[t]}))
    try:
        runner.act({"x": x[0].astype(np.float64)})
        refused = None
    except ObservationError as exc:
        refused = str(exc)
    print(json.dumps({"actions": np.stack(actions).tolist(), "refused": refused,
                      "interface": runner.interface,
                      "modules": sorted(m for m in sys.modules
                                        if m.startswith(("torch", "embodichain")))}))
""")


def ensembled(chunks: list[np.ndarray], m: float) -> np.ndarray:
    """ACT's temporal ensembling, written out: every earlier chunk's prediction for this
    step, the oldest weighted exp(0), the next exp(-m), and so on."""
    now = len(chunks) - 1
    preds = [c[now - k] for k, c in enumerate(chunks) if now - k < len(c)]
    weights = np.exp(-m * np.arange(len(preds)))
    return (weights[:, None] * np.stack(preds)).sum(0) / weights.sum()


def test_onnx_runner_needs_only_onnxruntime_and_numpy(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a runner that imports torch, embodichain_models or any other embodichain
    module (it would not start on a robot without them), and a temporal ensembling that
    weights the newest prediction first, forgets a slot's reset, or resets every slot: its
    actions over 6 steps of 2 episodes equal ACT's ensembling of the checkpoint model's
    chunks written out here."""
    artifact = tmp_path / "policy.onnx"
    result = export_deploying(tmp_path, "chunked", artifact, monkeypatch)
    assert result.exit_code == 0, result.output

    x = np.random.default_rng(0).standard_normal((STEPS, 2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    python = torch_free_python(tmp_path_factory)
    proc = subprocess.run([str(python), "-c", SCRIPT, str(ROOT), str(artifact),
                           str(tmp_path / "x.npy")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["modules"] == ["embodichain", "embodichain.core", "embodichain.core.deploy",
                              "embodichain.core.deploy.runner"]
    assert out["interface"]["execution"] == {"temporal_ensemble": M}
    assert "'x': dtype float64, the policy takes float32" in out["refused"]

    from embodichain.core.deploy.program import Flat, deployable_of
    from embodichain.core.deploy.trained import trained_model

    module, _ = deployable_of(trained_model(tmp_path / "run" / "last.pt").model, "chunked")
    with torch.no_grad():
        chunks = Flat(module, ["x"])(torch.from_numpy(x.reshape(-1, 4))).reshape(STEPS, 2, 3, 2)
    chunks = chunks.numpy()
    want = np.stack([
        np.stack([ensembled([chunks[s, slot] for s in range(start, t + 1)], M)
                  for slot, start in ((0, 0), (1, 0 if t < 3 else 3))])
        for t in range(STEPS)])
    np.testing.assert_allclose(np.array(out["actions"]), want, rtol=1e-5, atol=1e-5)
