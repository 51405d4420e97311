"""The old recording command, `python -m embodichain_models.policies.aloha.prepare`, still runs
the recorder (users have it in their shell history; the recorder moved to
`embodichain_models.data.aloha.prepare`). move56-keep: this file names the old path on purpose.

Catches: the forwarding module dropped with the move (the old command an import error), and a
forwarder that imports the recorder but never runs it (exit 0, nothing checked)."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import run_python_module

OLD = "embodichain_models.policies.aloha.prepare"
NEW = "embodichain_models.data.aloha.prepare"


def test_the_old_prepare_command_runs_the_moved_recorder(tmp_path: Path) -> None:
    out = tmp_path / "data"
    procs = [run_python_module(module, "--task", "transfer_cube", "--episodes", "0", str(out))
             for module in (OLD, NEW)]
    for proc in procs:
        assert proc.returncode == 2, proc.stderr
        assert "--episodes 0: at least 1" in proc.stderr
    assert procs[0].stderr == procs[1].stderr
    assert not out.exists()
