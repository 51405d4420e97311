"""The programmatic launch (R-API-1): `load_recipe`, `build_trainer` inside
`distributed_run`, `fit()` give train-sl's run (directory, claim, lock, resume rules,
signals, summary) and train-sl's model, bitwise, in one process and under torchrun.

Catches: `fit()` on a built trainer raising "no run directory attached"; a second copy of
the launch logic that drifts from the CLI's (another seed, another identity, no lock, a
lock let go once the start is decided).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import (
    CPU_RECIPE,
    FACTORIES,
    REPO,
    TIMEOUT,
    assert_ok,
    worker_env,
    write_recipe,
)
from tests.support.state_compare import assert_training_state_equal, comparable_records

EXAMPLE = REPO / "examples" / "learning" / "sl_ddp" / "train_from_python.py"


def _example(*args: str, nproc: int = 1, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                 f"--nproc-per-node={nproc}"] if nproc > 1 else [sys.executable])
    return subprocess.run([*launcher, str(EXAMPLE), *args], cwd=REPO, env=env or worker_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)


@pytest.mark.slow  # launches torchrun workers
@pytest.mark.parametrize("nproc, reference", [(1, "sl_ddp_one_process"),
                                              (2, "sl_ddp_two_workers")])
def test_the_example_trains_as_train_sl_bitwise(tmp_path: Path, nproc: int, reference: str,
                                                request: pytest.FixtureRequest) -> None:
    """The runnable example against the CLI's run of the same recipe (the shared fixtures:
    examples/learning/sl_ddp/cpu.yaml by train-sl, in one process and by 2 torchrun
    workers): every tensor of last.pt and every record of metrics.jsonl equal."""
    cli_run = request.getfixturevalue(reference)
    run = tmp_path / "run"
    proc = _example("--set", f"trainer.output_dir={run}", nproc=nproc)
    assert_ok(proc)
    assert "final metrics: {" in proc.stdout
    assert "finished at update 200/200" in proc.stdout + proc.stderr  # the CLI's summary
    assert assert_training_state_equal(run / "last.pt", cli_run / "last.pt") > 10
    assert comparable_records(run) == comparable_records(cli_run)
    ours, theirs = (json.loads((d / "run.json").read_text()) for d in (run, cli_run))
    assert ours["config_sha256"] != "" and ours["world_size"] == theirs["world_size"] == nproc
    assert {k: v for k, v in ours["config"].items() if k != "trainer"} == \
        {k: v for k, v in theirs["config"].items() if k != "trainer"}


def test_programmatic_runs_keep_the_clis_run_rules(tmp_path: Path) -> None:
    """In this process: a mapping recipe with overrides, a fit that claims its directory,
    a second fresh fit there refused (exit 2, nothing changed), `resume="auto"` continuing
    it, and a bad value refused by `load_recipe` before anything exists."""
    import yaml

    from embodichain.learning.sl import (
        ConfigError,
        UsageError,
        build_trainer,
        distributed_run,
        load_recipe,
        train,
    )

    run = tmp_path / "run"
    raw = yaml.safe_load(CPU_RECIPE.read_text())
    raw["trainer"]["output_dir"] = str(run)
    small = ["trainer.max_updates=6", "trainer.save_every=3", "trainer.validate_every=3"]
    with pytest.raises(ConfigError, match="trainer.data_workers: expected at most 1024"):
        load_recipe(raw, [*small, "trainer.data_workers=100000"])
    assert not run.exists()
    recipe = load_recipe(raw, small)
    with distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device)
        final = trainer.fit(show_progress=False)
    assert trainer.step == 6 and "validation/mse" in final
    identity = json.loads((run / "run.json").read_text())
    assert not (run / ".lock").exists() or _lock_is_free(run)
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    with pytest.raises(UsageError, match="already holds a run"):
        train(recipe, show_progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before
    longer = load_recipe(raw, [*small, "trainer.max_updates=9"])
    with distributed_run(longer.config.device) as device:
        trainer = build_trainer(longer, device, resume="auto")
        trainer.fit(show_progress=False)
    assert trainer.step == 9
    assert json.loads((run / "run.json").read_text())["run_id"] == identity["run_id"]


def _lock_is_free(run: Path) -> bool:
    from embodichain.core.runs.run_lock import lock_holder

    return lock_holder(run) is None


def test_a_running_programmatic_fit_holds_its_directory_until_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the programmatic fit letting go of its run directory's lock once the start
    is decided (e.g. `lock.release()` right after the start outcome): while a program's
    fit() waits at update 3 (the blocking factory; a snapshot at update 2), a `resume` of
    that directory and a second programmatic fit there must both be refused, naming the
    live holder's pid; without the lock the resume would train alongside it (exit 0) and
    the fit would be refused only as a directory that holds a run."""
    from embodichain.learning.sl import UsageError, load_recipe, train
    from tests.support.cli import invoke

    monkeypatch.syspath_prepend(str(FACTORIES))  # so that a wrongly allowed resume trains
    run, release = tmp_path / "run", tmp_path / "release"
    small = [f"trainer.output_dir={run}", "factory=blocking:build_supervised_trainer",
             "trainer.max_updates=4", "trainer.save_every=2", "trainer.validate_every=0"]
    env = worker_env(PYTHONPATH=os.pathsep.join([str(FACTORIES), str(REPO)]),
                     EMBODICHAIN_TEST_BLOCK_AT="3", EMBODICHAIN_TEST_BLOCK_FILE=str(release))
    proc = subprocess.Popen([sys.executable, str(EXAMPLE),
                             *(a for s in small for a in ("--set", s))], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not Path(f"{release}.rank0").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        holder = f"in use by a live run (held by pid {proc.pid} on "
        resumed = invoke("resume", str(run), "--no-progress")
        assert resumed.exit_code == 2, resumed.output
        assert holder in resumed.stderr, resumed.stderr
        with pytest.raises(UsageError, match=re.escape(holder)):
            train(load_recipe(CPU_RECIPE, small), show_progress=False)
        release.touch()
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "finished at update 4/4" in out + err


def test_a_stop_signal_stops_a_programmatic_fit_with_a_snapshot(tmp_path: Path) -> None:
    """SIGTERM to a program's fit(): the snapshot of the update it reached, `Stopped` with
    exit code 143, and the resume command, as train-sl does."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--set", f"trainer.output_dir={run}",
         "--set", "trainer.max_updates=100000000", "--set", "trainer.save_every=0",
         "--set", "trainer.validate_every=0", "--set", "trainer.log_every=100"],
        cwd=REPO, env=worker_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (run / "metrics.jsonl").exists() or \
                not (run / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "stopped by SIGTERM at update" in err and f"embodichain resume {run}" in err
    assert (run / "last.pt").exists()


def test_a_trainer_not_built_by_build_trainer_says_how_to_fit(tmp_path: Path) -> None:
    """A factory called directly gives a trainer without a run: its fit() names the API."""
    from embodichain.learning.sl import distributed_run, load_recipe

    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "run"))
    with distributed_run("cpu") as device:
        trainer = recipe.factory(recipe.config, device)
        with pytest.raises(RuntimeError, match="embodichain.learning.sl.build_trainer"):
            trainer.fit()
        trainer.close()
    assert not (tmp_path / "run").exists()
