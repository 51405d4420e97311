"""Helpers shared by the CLI tests: the CLI in this process, throwaway plugins."""

from __future__ import annotations

import os
import subprocess
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from embodichain.cli import app
from tests.support.processes import FACTORIES, assert_ok, factories_env, run_cli
from tests.support.recipes import write_recipe

FAKE_DIST = "fakeplugin"
FAKE_FACTORY = "fakeplugin"
DATA_FACTORY = "datafactory_mod:build_supervised_trainer"


def invoke(*args: str) -> Result:
    """Run the CLI in this process (fast: torch and the factories stay imported)."""
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("CLI raised instead of reporting:\n" + "".join(
            traceback.format_exception(result.exception)))
    return result


def export_deploying(tmp_path: Path, factory: str, artifact: Path,
                     monkeypatch: pytest.MonkeyPatch, launch: Callable[..., object] = run_cli,
                     **changes: object) -> Result:
    """Train the test factory `deploying:<factory>` (tests/factories/deploying.py) for 2
    updates into tmp_path/run (`launch`: run_cli, or run_torchrun for 2 workers; `changes`
    as dotted keys), then `export RUN --policy ARTIFACT` in this process: its result."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{"factory": f"deploying:{factory}", "trainer.max_updates": 2,
                             "trainer.save_every": 2, **changes})
    assert_ok(launch("train-sl", "--config", str(recipe), "--no-progress",
                     env=factories_env()))
    monkeypatch.syspath_prepend(str(FACTORIES))  # the checkpoint names the factory's module
    return invoke("export", str(tmp_path / "run"), "--policy", str(artifact))


def make_plugins(root: Path) -> Path:
    """A directory to put on sys.path / PYTHONPATH holding two throwaway plugins.

    - distribution `fakeplugin` 0.1 registers factory `fakeplugin` in entry-point group
      `embodichain.sl_factories`; its module raises on import;
    - module `datafactory_mod` (no distribution) is a factory whose schema requires an
      existing `data.path` file.
    """
    root.mkdir(parents=True, exist_ok=True)
    info = root / f"{FAKE_DIST}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {FAKE_DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[embodichain.sl_factories]\n{FAKE_FACTORY} = fakeplugin_mod:build_supervised_trainer\n")
    (root / "fakeplugin_mod.py").write_text(
        'raise RuntimeError("fakeplugin is broken on purpose")\n')
    (root / "datafactory_mod.py").write_text(
        "from pydantic import BaseModel, ConfigDict, FilePath\n\n\n"
        "class Data(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    path: FilePath\n\n\n"
        "class Schema(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    data: Data\n\n\n"
        "def build_supervised_trainer(config, device):\n"
        "    raise NotImplementedError\n\n\n"
        "build_supervised_trainer.config_schema = Schema\n")
    return root


def with_pythonpath(env: dict[str, str], *paths: Path) -> dict[str, str]:
    parts = [str(p) for p in paths] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    return {**env, "PYTHONPATH": os.pathsep.join(parts)}


def cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`embodichain ARGS` run by `invoke`, as the CompletedProcess `run_cli` returns: for
    read-only commands (inspect-checkpoint, runs, validate-config) in tests that are not
    about the process itself, without a fresh interpreter importing torch for each call."""
    result = invoke(*args)
    return subprocess.CompletedProcess(["embodichain", *args], result.exit_code,
                                       result.stdout, result.stderr)
