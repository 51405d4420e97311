"""tests/support/processes.py's `worker_env`: the environment of the processes tests launch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import worker_env


def test_a_tests_pythonpath_goes_before_the_callers_which_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches `worker_env(PYTHONPATH=...)` replacing the caller's PYTHONPATH: where that
    path is what makes the project under test importable (a checkout run without an
    install), a launched worker would import another installed copy, or none. The test's
    entries come first (its factories), the caller's follow without repeats; a process
    launched with it imports from both."""
    checkout, factories = tmp_path / "checkout", tmp_path / "factories"
    for directory, module in ((checkout, "project_under_test"), (factories, "a_factory")):
        directory.mkdir()
        (directory / f"{module}.py").write_text(f"WHERE = {directory.name!r}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(checkout), str(factories)]))
    env = worker_env(PYTHONPATH=str(factories))
    assert env["PYTHONPATH"].split(os.pathsep) == [str(factories), str(checkout)]
    proc = subprocess.run([sys.executable, "-S", "-c", "import a_factory, project_under_test; "
                           "print(a_factory.WHERE, project_under_test.WHERE)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["factories", "checkout"], \
        proc.stderr
    monkeypatch.delenv("PYTHONPATH")
    assert worker_env(PYTHONPATH=str(factories))["PYTHONPATH"] == str(factories)
    assert "PYTHONPATH" not in worker_env()
