"""`embodichain export CKPT OUT.pt`: the trained model as a plain state_dict (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.plugins.sl_ddp import make_model
from tests.support import assert_ok, run_cli, write_recipe
from tests.support.cli import invoke


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    recipe = write_recipe(root / "r.yaml", root / "run", **{"trainer.max_updates": 3,
                                                           "trainer.save_every": 3})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    return root / "run"


def test_export_writes_a_state_dict_that_loads_into_the_model(run: Path, tmp_path: Path
                                                               ) -> None:
    """Catches an export that is not loadable with weights_only=True into the factory's
    model, or whose tensors differ from the checkpoint's model."""
    out = tmp_path / "model.pt"
    result = invoke("export", str(run / "step_3.pt"), str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout and "update 3" in result.stdout
    state = torch.load(out, weights_only=True)
    model = make_model(32)
    model.load_state_dict(state)  # strict: every key, nothing extra
    saved = read_checkpoint(run / "step_3.pt")["payload"]["learner"]["model"]
    assert state.keys() == saved.keys()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temp file left

    # A run directory means its last.pt; an existing OUT is replaced only with --force.
    before = out.read_bytes()
    assert invoke("export", str(run), str(out)).exit_code == 2
    assert out.read_bytes() == before
    out.write_bytes(b"stale")
    assert invoke("export", str(run), str(out), "--force").exit_code == 0
    assert torch.load(out, weights_only=True).keys() == saved.keys()


def test_a_format_without_policy_is_refused(run: Path, tmp_path: Path) -> None:
    """Round 5's hand-made bug 13: `export RUN m.pt --format onnx` (no --policy) writing a
    state_dict and exiting 0 (the user asked for an ONNX file and got weights named .pt).
    Refused (exit 2) naming --format and --policy; nothing written."""
    out = tmp_path / "m.pt"
    result = invoke("export", str(run), str(out), "--format", "onnx")
    assert result.exit_code == 2, result.output
    assert "--format" in result.stderr and "--policy" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_export_ema_takes_the_learners_ema_entry(run: Path, tmp_path: Path) -> None:
    """Catches `--ema` exporting the raw weights (or failing) when the checkpoint carries
    `payload.learner.ema`, the place a run with trainer.ema keeps it."""
    data = read_checkpoint(run / "step_3.pt")
    model = data["payload"]["learner"]["model"]
    ema = {k: v + 1.0 for k, v in model.items()}
    data["payload"]["learner"]["ema"] = {"model": ema, "decay": 0.99}
    with_ema = tmp_path / "with_ema.pt"
    write_checkpoint(make_checkpoint(data["payload"]), with_ema)

    out = tmp_path / "ema.pt"
    result = invoke("export", str(with_ema), str(out), "--ema")
    assert result.exit_code == 0, result.output
    assert "EMA weights" in result.stdout
    state = torch.load(out, weights_only=True)
    assert all(torch.equal(state[k], ema[k]) for k in ema)
    plain = tmp_path / "plain.pt"
    assert invoke("export", str(with_ema), str(plain)).exit_code == 0
    assert all(torch.equal(torch.load(plain, weights_only=True)[k], model[k]) for k in model)


def test_export_refuses_a_tampered_checkpoint(run: Path, tmp_path: Path) -> None:
    """Catches an export that skips the digest: a checkpoint whose payload was changed
    after writing is refused (exit 2), and nothing is written."""
    data = torch.load(run / "step_3.pt", weights_only=True)
    first = next(iter(data["payload"]["learner"]["model"]))
    data["payload"]["learner"]["model"][first] += 1.0  # the manifest's digest now lies
    tampered = tmp_path / "tampered.pt"
    torch.save(data, tampered)
    out = tmp_path / "model.pt"
    result = invoke("export", str(tampered), str(out))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "tampered.pt" in result.stderr
    assert not out.exists()
