"""Fixtures: the expensive runs that several tests read (each run once per test run, also
under pytest-xdist: tests/support/shared.py).

Plain helpers live in tests/support/."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# MuJoCo renders headless in the tests (software EGL here, CI's environment has no display):
# without it, dm_control tries GLFW first, which aborts the process that renders (a test
# recording camera frames in the pytest worker took its xdist node down).
os.environ.setdefault("MUJOCO_GL", "egl")

from tests.support import (
    RESTART_RECIPE,
    SHORT_RECIPE,
    TIMEOUT,
    assert_ok,
    factories_env,
    run_cli,
    run_torchrun,
    start_endless_run,
    worker_env,
    write_recipe,
)
from tests.support.shared import built_once

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 (a plain pytest run has neither);
# the CLI's piped output reads COLUMNS, so the tests would see another width than asked for.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


@pytest.fixture(scope="session", autouse=True)
def _test_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The per-user cache (digests, LeRobot table copies) of this test process, under pytest's
    temporary directory rather than the user's ~/.cache: the suite leaves nothing behind
    there. A test about the cache's own location sets or unsets the variables itself."""
    if "EMBODICHAIN_CACHE_DIR" not in os.environ:
        os.environ["EMBODICHAIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("user_cache"))


def _train_example(root: Path, launch) -> str:
    recipe = write_recipe(root / "cpu.yaml", root / "run")
    proc = launch("train-sl", "--config", str(recipe), "--no-progress")
    assert_ok(proc)
    # What the run printed, beside (not inside) its directory, for tests of the output.
    (root / "stdout.txt").write_text(proc.stdout)
    (root / "stderr.txt").write_text(proc.stderr)
    return str(root / "run")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_SIGNALS_AT_START = ({sig: signal.getsignal(sig) for sig in STOP_SIGNALS},
                     signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.fixture(autouse=True)
def _stop_signals_restored() -> Iterator[None]:
    """The stop signals as this pytest process had them, again after each test. Product code
    run in-process may leave SIGTERM ignored (a refused or failed distributed run ignores
    torchrun's closing SIGTERM, core/distributed/process_group.py) or blocked; a fresh
    `Popen` child would inherit that and outlive a later test's SIGTERM."""
    yield
    handlers, mask = _SIGNALS_AT_START
    for sig, handler in handlers.items():
        if signal.getsignal(sig) is not handler and handler is not None:
            signal.signal(sig, handler)
    if signal.pthread_sigmask(signal.SIG_BLOCK, []) != mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


@pytest.fixture()
def digest_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A per-user digest cache of this test's own (EMBODICHAIN_CACHE_DIR)."""
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def sl_ddp_two_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe trained to 200 updates by 2 torchrun workers (shared, read-only)."""
    return Path(built_once(tmp_path_factory, "sl_ddp_2w",
                           lambda root: _train_example(root, run_torchrun)))


@pytest.fixture(scope="session")
def sl_ddp_one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe trained to 200 updates in one process (shared, read-only)."""
    return Path(built_once(tmp_path_factory, "sl_ddp_1p",
                           lambda root: _train_example(root, run_cli)))


@pytest.fixture()
def copy_run(tmp_path: Path):
    """Copy a shared run directory before a test modifies it."""
    def copy(src: Path, name: str = "run") -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst
    return copy


# -- runs that several test files share (each trained once per session, read-only) -------------

@pytest.fixture(scope="session")
def restart_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RESTART_RECIPE trained to 300 updates by 2 torchrun workers without interruption: the
    reference of every recovery-by-restart and multi-node scenario (shared, read-only)."""
    def build(root: Path) -> str:
        recipe = write_recipe(root / "r.yaml", root / "run", **RESTART_RECIPE)
        assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                               env=factories_env()))
        return str(root / "run")
    return Path(built_once(tmp_path_factory, "restart_reference", build))


@pytest.fixture(scope="session")
def short_two_workers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SHORT_RECIPE (12 updates, a save after each) trained by 2 torchrun workers without
    interruption: the reference of the torchrun kill-point scenarios (shared, read-only)."""
    def build(root: Path) -> str:
        recipe = write_recipe(root / "r.yaml", root / "run", **SHORT_RECIPE)
        assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                               timeout=240))
        return str(root / "run")
    return Path(built_once(tmp_path_factory, "short_two_workers", build))


@pytest.fixture(scope="session")
def resumed_at_100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe (with the TensorBoard logger too) trained in one process to
    update 100, then continued in place by `resume --set trainer.max_updates=200`.
    `at_100/` is a copy of the run as it was at update 100, `run/` the continued run
    (shared, read-only)."""
    def build(root: Path) -> str:
        run = root / "run"
        recipe = write_recipe(root / "r.yaml", run, **{
            "trainer.loggers": ["jsonl", "tensorboard"], "trainer.max_updates": 100})
        assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
        shutil.copytree(run, root / "at_100")
        assert_ok(run_cli("resume", str(run), "--set", "trainer.max_updates=200",
                          "--no-progress"))
        return str(root)
    return Path(built_once(tmp_path_factory, "resumed_at_100", build))


@pytest.fixture(scope="session")
def endless_run_stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """`start_endless_run` into `outputs/live`, looked at by `embodichain runs` while it is
    live (once step_500.pt exists and the lock names its holder), then stopped by SIGTERM.
    Returns what each step saw: `run`, `pid`, `live_json` and `live_table` (the `runs`
    outputs while live), `returncode`, `stdout`, `stderr` (shared, read-only)."""
    import json
    import signal
    import time

    from embodichain.core.runs.run_lock import lock_holder

    def build(root: Path) -> dict[str, object]:
        run = root / "outputs" / "live"
        proc = start_endless_run(root, run, stdout=subprocess.PIPE)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not ((run / "step_500.pt").exists() and lock_holder(run)):
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the endless run never saved step_500.pt"
                time.sleep(0.2)
            listed = run_cli("runs", str(run.parent), "--json")
            table = run_cli("runs", str(run.parent), env=worker_env(COLUMNS="200"))
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert_ok(listed)
        assert_ok(table)
        return {"run": str(run), "pid": proc.pid, "live_json": json.loads(listed.stdout),
                "live_table": table.stdout, "returncode": proc.returncode, "stdout": out,
                "stderr": err}

    seen = built_once(tmp_path_factory, "endless", build)
    return {**seen, "run": Path(seen["run"])}


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its launch counts to the controller (see pytest_testnodedown)."""
    from tests.support.processes import LAUNCHES

    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["launches"] = dict(LAUNCHES)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: called in the controller
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - xdist's WorkerController
    from tests.support.processes import LAUNCHES

    LAUNCHES.update(getattr(node, "workeroutput", {}).get("launches", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How the CLI and torchrun were launched (all workers): a launch that silently lost the
    warm interpreter (tests/support/warm_python.py) shows here with its reason, and torchrun
    workers left fresh because torch is not what the harness expects, once, as a warning."""
    from tests.support.processes import LAUNCHES, launch_summary

    for line in launch_summary(LAUNCHES):
        terminalreporter.write_line(line, yellow=line.startswith("WARNING"), bold=True)


# The tests whose launches CI starts fresh (EMBODICHAIN_TESTS_FRESH=marked: every process,
# every rank a new interpreter with its own hash seed and imports, as in production; see
# docs/development.md): the quick distributed, recovery and launch tests, and the slow ones
# where ranks agree the most: a 2-worker bitwise resume, per-rank random streams, an elastic
# continuation each way under FSDP (shards re-cut), a SIGKILL mid-save under FSDP, and a
# validation failure on one FSDP rank after and before the forward's collectives.
FRESH_DIRECTORIES = ("tests/core/distributed/", "tests/recovery/", "tests/core/launch/")
FRESH_SLOW_TESTS = frozenset({
    "tests/recovery/test_recovery_exact.py::test_two_workers_resume_from_step_100_is_bitwise_exact",
    "tests/recovery/test_recovery_per_rank.py::"
    "test_each_rank_resumes_its_own_random_streams_and_buffers",
    "tests/recovery/test_elastic_resume.py::test_two_ranks_continue_on_one_in_place[fsdp]",
    "tests/recovery/test_elastic_resume.py::test_one_rank_continues_on_two_from_a_checkpoint[fsdp]",
    "tests/recovery/test_fsdp_recovery.py::"
    "test_sigkill_before_a_manifest_is_published_then_resume_is_bitwise",
    "tests/core/training/test_fsdp_parity.py::"
    "test_a_validation_failure_on_rank_one_stops_every_rank_naming_it",
    "tests/core/training/test_fsdp_parity.py::"
    "test_a_validation_failure_before_the_forward_is_what_the_run_records",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests CI runs fresh (`fresh_workers`); then modules with the most `slow`
    tests first (otherwise in their order). Under xdist (`--dist loadfile`) a module runs
    whole on one worker, so the long ones start at once and the run does not end with one
    worker alone on a long module."""
    for item in items:
        if item.nodeid in FRESH_SLOW_TESTS or (item.nodeid.startswith(FRESH_DIRECTORIES)
                                               and not item.get_closest_marker("slow")):
            item.add_marker("fresh_workers")
    slow: Counter[str] = Counter(item.nodeid.split("::")[0] for item in items
                                 if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])


@pytest.fixture(autouse=True)
def _fresh_workers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under EMBODICHAIN_TESTS_FRESH=marked, a `fresh_workers` test's own launches are fresh
    (the shared runs its fixtures read were built before, warm)."""
    if (os.environ.get("EMBODICHAIN_TESTS_FRESH") == "marked"
            and request.node.get_closest_marker("fresh_workers")):
        monkeypatch.setenv("EMBODICHAIN_TESTS_FRESH", "1")
