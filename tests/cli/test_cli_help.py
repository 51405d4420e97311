"""Help, version and completion; validate-config and list-factories stay torch-free for the
built-in recipes (issue 12). Speed itself is measured, not asserted: see the README."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import embodichain
from embodichain.cli import app
from embodichain.cli.examples import EXAMPLES
from tests.support import CPU_RECIPE, REPO, run_cli, worker_env
from tests.support.cli import invoke

NERD_RECIPE = REPO / "examples/learning/nerd/configs/cartpole/sl.train.yaml"
COMMANDS = sorted(info.name for info in app.registered_commands)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_ends_with_examples_and_shows_flags_as_flags(command: str) -> None:
    result = invoke(command, "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    examples = text[text.index("Examples:"):].splitlines()[1:]
    commands = [line.strip() for line in examples if line.strip()]
    assert 2 <= len(commands) <= 3 and commands == EXAMPLES[command]
    assert all("embodichain" in line and command in line for line in commands)
    assert "<bool" not in text  # flags are shown as flags: `--json`, not `--json <bool>`


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"embodichain {embodichain.__version__}"


def test_shell_completion_is_installable() -> None:
    result = invoke("--help")
    assert "--install-completion" in result.stdout and "--show-completion" in result.stdout
    proc = run_cli("--show-completion", "bash", timeout=60)
    assert proc.returncode == 0 and "complete" in proc.stdout, proc.stderr


def _modules_after(args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    """Run the CLI in a fresh interpreter; which heavy modules did it import, and its exit."""
    code = (
        "import json, sys\n"
        "from embodichain.cli import app\n"
        "try:\n"
        f"    app({args!r})\n"
        "except SystemExit as exc:\n"
        "    code = exc.code\n"
        "heavy = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')\n"
        "               or m in ('embodichain.plugins.sl_ddp',\n"
        "                        'embodichain_models.dynamics.nerd.sl_recipe'))\n"
        "print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                          env=worker_env(**(env_extra or {})), capture_output=True, text=True,
                          timeout=120)
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [
    ["validate-config", str(CPU_RECIPE)],
    ["validate-config", str(CPU_RECIPE), "--set", "model.hidden=64"],
    ["list-factories"],
    ["--help"],
], ids=["validate-sl_ddp", "validate-with-set", "list-factories", "help"])
def test_checking_commands_do_not_import_torch(args: list[str]) -> None:
    found = _modules_after(args)
    assert found == {"code": 0, "heavy": []}


def test_validating_the_nerd_recipe_does_not_import_torch(tmp_path: Path) -> None:
    """The NeRD recipe names its factory as `module:attr`; its registered schema serves."""
    for split in ("train", "val"):
        (tmp_path / f"{split}.pt").write_bytes(b"not read by validate-config")
    found = _modules_after(["validate-config", str(NERD_RECIPE),
                            "--set", f"data.train={tmp_path / 'train.pt'}",
                            "--set", f"data.val={tmp_path / 'val.pt'}"])
    assert found == {"code": 0, "heavy": []}


def test_a_factory_without_a_registered_schema_is_still_imported(tmp_path: Path) -> None:
    """Third-party factories whose module imports torch work as before."""
    (tmp_path / "torchy_factory.py").write_text(
        "import torch\n"
        "from pydantic import BaseModel, ConfigDict\n\n\n"
        "class Schema(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    width: int = 3\n\n\n"
        "def build(config, device):\n"
        "    raise NotImplementedError\n\n\n"
        "build.config_schema = Schema\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(CPU_RECIPE.read_text().replace("factory: sl_ddp",
                                                     "factory: torchy_factory:build")
                      .replace("model: {hidden: 32}", "width: true")
                      .replace("data: {train_size: 4096, val_size: 1024, seed: 1234}", ""))
    found = _modules_after(["validate-config", str(recipe)],
                           {"PYTHONPATH": str(tmp_path)})
    assert found["code"] == 2 and "torch" in found["heavy"]  # imported, and `true` refused
    recipe.write_text(recipe.read_text().replace("width: true", "width: 5"))
    found = _modules_after(["validate-config", str(recipe)], {"PYTHONPATH": str(tmp_path)})
    assert found["code"] == 0 and "torch" in found["heavy"]
