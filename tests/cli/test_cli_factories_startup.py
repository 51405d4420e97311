"""`list-factories` with a broken plugin (R-PLUG-1), and the cheap-import guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import REPO, run_cli, worker_env
from tests.support.cli import FAKE_DIST, FAKE_FACTORY, make_plugins, with_pythonpath


def test_list_factories_shows_a_broken_plugin_without_failing(tmp_path: Path) -> None:
    plugins = make_plugins(tmp_path / "plugins")
    env = with_pythonpath(worker_env(COLUMNS="200"), plugins)
    proc = run_cli("list-factories", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("│")}
    assert "embodichain.plugins.sl_ddp:build_supervised_trainer" in rows["sl_ddp"]
    assert "embodichain" in rows["sl_ddp"] and " ok " in rows["sl_ddp"]
    fake = rows[FAKE_FACTORY]
    assert "fakeplugin_mod:build_supervised_trainer" in fake
    assert FAKE_DIST in fake and "0.1" in fake and "broken" in fake
    assert f"broken: {FAKE_FACTORY}: importing 'fakeplugin_mod'" in proc.stdout
    assert "RuntimeError: fakeplugin is broken on purpose" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=120)


def test_importing_the_cli_imports_neither_torch_nor_factories() -> None:
    proc = _fresh_python(
        "import sys, embodichain, embodichain.cli\n"
        "heavy = [m for m in ('torch', 'pydantic', 'yaml', 'embodichain.plugins.sl_ddp',\n"
        "                     'embodichain_models', 'embodichain.core.recipe.schema')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n")
    assert proc.returncode == 0, proc.stderr


def test_help_imports_neither_torch_nor_factories() -> None:
    proc = _fresh_python(
        "import sys\n"
        "from embodichain.cli import app\n"
        "for args in (['--help'], ['validate-config', '--help'], ['train-sl', '--help'],\n"
        "             ['inspect-checkpoint', '--help']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (args, exc.code)\n"
        "heavy = [m for m in ('torch', 'embodichain.plugins.sl_ddp', 'embodichain_models')\n"
        "         if m in sys.modules]\n"
        "assert not heavy, heavy\n")
    assert proc.returncode == 0, proc.stderr
    for command in ("validate-config", "inspect-checkpoint", "list-factories", "train-sl",
                    "resume"):
        assert command in proc.stdout
