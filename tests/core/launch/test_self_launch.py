"""R-PROC-3 for `--nproc-per-node N` (self-launch): the workers' command is the parsed one,
a refusal is final under `--max-restarts`, and a real failure is still restarted."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.commands import SELF_LAUNCHED
from tests.support import REPO, start_python_module, worker_env, write_recipe

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

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
    # (rank 0 may also record the failure it saw when rank 1 was killed: a race)
    assert [(e["event"], e["step"]) for e in events if e["event"] != "failed"] == [
        ("resumed", 10)]


def test_sigterm_to_the_self_launcher_stops_with_a_snapshot_and_exits_143(
        tmp_path: Path) -> None:
    """R-SIG-1 through self-launch: the launcher passes SIGTERM on, every rank stops at the
    same update, and the launcher itself exits 143 with one `stopped by` line. Catches
    a launcher that exits 1 or prints torch's SignalException traceback (torchrun's own way),
    and workers that ignore the signal (they would train on to update 200)."""
    run, release = tmp_path / "run", tmp_path / "release"
    recipe = write_recipe(tmp_path / "r.yaml", run,
                          factory="blocking:build_supervised_trainer")
    env = worker_env(PYTHONPATH=str(FACTORIES), EMBODICHAIN_TEST_BLOCK_AT="7",
                     EMBODICHAIN_TEST_BLOCK_FILE=str(release))
    proc = start_python_module("embodichain", "train-sl", "--config", str(recipe),
                               "--nproc-per-node", "2", "--no-progress", env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not all(Path(f"{release}.rank{r}").exists() for r in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)  # the agent passes it on to both workers, which are held at update 7
        release.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    # update 7's stop flag was taken before its objective held it: the flag rides update
    # 8's all-reduce, whose figures are read after update 9 (R-GPU-1): the stop lands at 9
    assert [line for line in err.splitlines() if line.startswith("stopped by")] == [
        f"stopped by SIGTERM at update 9 of 200: saved {run / 'last.pt'} (update 9), so no "
        f"work is lost. Continue with: embodichain resume {run} --nproc-per-node 2"], err
    assert "Traceback" not in err and "terminate called" not in err, err
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 9


def test_a_signal_landing_inside_torchs_metrics_wrapper_is_still_a_stop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R-SIG-1: torch raises the agent's SignalException from its signal handler, so it can
    land in `metrics.prof`'s wrapper before `start = time.time()` is bound; its `finally` then
    raises UnboundLocalError with the stop as its context (seen once in CI: the launcher
    exited 1 with `error: UnboundLocalError`). Driven here through torch's own wrapper, the
    signal arriving in that `time.time()`. Catches a launcher that looks only at the raised
    exception's type."""
    from torch.distributed.elastic import metrics
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from embodichain.core.launch import self_launch

    def signalled() -> float:
        raise SignalException("Process got signal: 15", sigval=signal.SIGTERM)

    @metrics.prof
    def run_the_agent(nproc_per_node: int, worker_args: object) -> None:
        raise AssertionError("the signal arrives before the agent runs")

    monkeypatch.setattr(metrics.api.time, "time", signalled)
    monkeypatch.setattr(self_launch, "_launch_once", run_the_agent)
    monkeypatch.setattr(self_launch, "ran_an_agent", False)  # launch() sets both: undone after
    monkeypatch.setenv(SELF_LAUNCHED, "1")
    with pytest.raises(UnboundLocalError):  # torch's wrapper really turns the stop into this
        run_the_agent(2, [])
    assert self_launch.launch(2, 0, ["train-sl"]) == 143
