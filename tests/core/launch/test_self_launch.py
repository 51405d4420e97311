"""R-PROC-3 for `--nproc-per-node N` (self-launch): the workers' command is the parsed one,
a refusal is final under `--max-restarts`, and a real failure is still restarted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO, worker_env, write_recipe

from embodichain.core.checkpoint.file import read_checkpoint

FACTORIES = REPO / "tests" / "factories"


def _app(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`app([ARGS])` called from Python with an unrelated sys.argv, in a child process (the
    elastic agent takes over the signal handlers of the process it runs in)."""
    code = ("import sys; from embodichain.cli import app; sys.argv = ['not-embodichain', "
            "'--bogus']; app(sys.stdin.read().split('\\0'), prog_name='embodichain')")
    return subprocess.run([sys.executable, "-c", code], input="\0".join(args), cwd=REPO,
                          env=env or worker_env(), capture_output=True, text=True, timeout=300)


def test_a_refusal_under_max_restarts_is_refused_once_and_not_retried(tmp_path: Path) -> None:
    """Catches torch's own restart loop (every attempt refused again: M + 1 messages, exit
    1) and a self-launch that re-reads sys.argv (the workers would run `--bogus`)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    missing = tmp_path / "missing.pt"
    proc = _app("train-sl", "--config", str(recipe), "--resume", str(missing),
                "--nproc-per-node", "2", "--max-restarts", "2", "--no-progress")
    assert proc.returncode == 2, proc.stderr
    printed = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(printed) == 1 and str(missing) in printed[0], proc.stderr
    assert proc.stderr.count("exitcode  : 2") == 2  # one failure report, both workers
    assert "restarting" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_failure_under_max_restarts_is_restarted_and_finishes(tmp_path: Path) -> None:
    """The self-launcher's own restart loop still restarts a real failure (here rank 1
    SIGKILLed once at update 15), and `--resume auto` continues the run to its end."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{
        "factory": "restarting:build_supervised_trainer", "trainer.max_updates": 30,
        "trainer.save_every": 10, "trainer.validate_every": 10, "trainer.log_every": 5})
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "k"),
                     EMBODICHAIN_TEST_KILLS=json.dumps([{"id": "a", "rank": 1,
                                                         "update": 15}]))
    proc = _app("train-sl", "--config", str(recipe), "--resume", "auto", "--nproc-per-node",
                "2", "--max-restarts", "1", "--no-progress", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("restarting all 2 workers (1 of 1 restarts left)") == 1
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 30
    events = json.loads((run / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events] == [("resumed", 10)]
