"""Paths of the test tree and the processes tests start: the CLI, torchrun, a live run."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import child_pids as child_pids  # one /proc walk for both
from tests.support.warm_python import (
    WarmPopen,
    WarmPython,
    descendants,
    environ_of,
    fresh_only,
    launches_workers,
    warm_python,
)

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"  # helper scripts that tests launch
FACTORIES = TESTS / "factories"  # test-only recipe factories
CPU_RECIPE = REPO / "examples" / "learning" / "sl_ddp" / "cpu.yaml"
TIMEOUT = 300
LAUNCHES: Counter[str] = Counter()  # how `run_`/`start_python_module` launched (session summary)
WORKERS_FRESH = "warm, workers fresh"  # the start of a LAUNCHES key that `launch_summary` warns of


def worker_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test launches: this one's, with one thread per
    process, unbuffered output and `extra`. A `PYTHONPATH` in `extra` comes first and the
    caller's follows it (its entries not repeated): replacing it could make the launched
    process import another installed copy of the project than the one under test."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    if "PYTHONPATH" in extra:
        extra = {**extra, "PYTHONPATH": pythonpath_before(extra["PYTHONPATH"],
                                                          os.environ.get("PYTHONPATH", ""))}
    env.update(extra)
    return env


def pythonpath_before(first: str, callers: str) -> str:
    """`first`'s entries, then those of `callers` not among them (empty entries dropped)."""
    entries = [e for e in first.split(os.pathsep) if e]
    entries += [e for e in callers.split(os.pathsep) if e and e not in entries]
    return os.pathsep.join(entries)


def factories_env(**extra: str) -> dict[str, str]:
    """Worker environment in which the test factories of tests/factories resolve."""
    return worker_env(PYTHONPATH=str(FACTORIES), **extra)


def run_python_module(module: str, *args: str, cwd: Path | None = None,
                      env: dict[str, str] | None = None, timeout: float = TIMEOUT,
                      fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS`, its output captured; forked from the warm interpreter
    (tests/support/warm_python.py) unless `fresh` or the environment needs a fresh one."""
    env = env or worker_env()
    cwd = cwd or REPO
    warm = _warm_for(module, args, env, fresh)
    if warm is not None:
        return warm.run(module, list(args), cwd=cwd, env=env, timeout=timeout)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def start_python_module(module: str, *args: str, cwd: Path | None = None,
                        env: dict[str, str] | None = None, fresh: bool = False,
                        **popen_kwargs: Any) -> subprocess.Popen | WarmPopen:
    """`subprocess.Popen([python, "-m", MODULE, *ARGS], ...)` for a test that holds the
    launch (signals it, watches its processes, reads its output while it runs): forked from
    the warm interpreter where `run_python_module` would be (`WarmPopen`, a real pid),
    else a fresh `Popen`. `popen_kwargs`: stdin, stdout, stderr, start_new_session, text.
    A test about the launcher's parent, or about start-up itself, asks for `fresh`."""
    env = env or worker_env()
    cwd = cwd or REPO
    warm = _warm_for(module, args, env, fresh)
    if warm is not None:
        return warm.popen(module, list(args), cwd=cwd, env=env, **popen_kwargs)
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                            **popen_kwargs)


def _warm_for(module: str, args: tuple[str, ...], env: dict[str, str], fresh: bool
              ) -> WarmPython | None:
    """The warm interpreter to launch `module` from (None: a fresh one), counted."""
    why = "asked" if fresh else "EMBODICHAIN_TESTS_FRESH" if fresh_only() else None
    if why is None:
        warm = warm_python(worker_env())
        why = warm.why_fresh(env)
        if why is None:
            workers_fresh = warm.workers_fresh and launches_workers(module, list(args))
            LAUNCHES[f"{WORKERS_FRESH} ({warm.workers_fresh})" if workers_fresh else "warm"] += 1
            return warm
    LAUNCHES[f"fresh ({why})"] += 1
    return None


def torchrun_workers(agent: int) -> dict[int, int]:
    """Rank -> pid of the workers torchrun's agent `agent` started: the first processes
    below it whose environment sets RANK (fresh workers are the agent's children; warm
    ones, the children of its worker server, whose /proc environ is not theirs)."""
    found: dict[int, int] = {}
    skip: set[int] = set()
    for pid in descendants(agent)[1:]:  # parents first
        if pid in skip:
            continue
        try:
            rank = environ_of(pid).get("RANK")
        except OSError:
            continue  # ended meanwhile
        if rank is not None:
            found[int(rank)] = pid
            skip.update(descendants(pid))  # its own children (data workers) inherit RANK
    return found


def torchrun_killpg_race(stderr: str) -> bool:
    """Whether torchrun itself died of `ProcessLookupError` in its `os.killpg` of a worker
    group that had already exited (torch's elastic `SubprocessHandler.close` does not guard
    it), instead of printing its report of the workers' exit codes. It happens after every
    rank stopped, so a test of how ranks stop accepts it beside that report (seen in CI)."""
    return "ProcessLookupError" in stderr and "os.killpg(self.proc.pid" in stderr


def launch_summary(launches: Counter[str]) -> list[str]:
    """The session summary's lines: how many launches of each kind, then a warning for each
    reason the warm interpreter left torchrun's workers fresh (torch is not what it expects)."""
    lines = ["python -m launches: " + ", ".join(
        f"{count} {how}" for how, count in launches.most_common())] if launches else []
    for how in sorted(h for h in launches if h.startswith(WORKERS_FRESH)):
        lines.append("WARNING: torchrun's workers were started fresh, not forked warm: "
                     f"{how[len(WORKERS_FRESH) + 2:-1]}. The tests still hold, only slower; "
                     "tests/support/warm_python.py needs updating for this torch.")
    return lines


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = TIMEOUT, fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """`python -m embodichain ARGS` in one process (`fresh`: a new interpreter, for tests
    about start-up itself)."""
    return run_python_module("embodichain", *args, cwd=cwd, env=env, timeout=timeout,
                             fresh=fresh)


def run_torchrun(*args: str, nproc: int = 2, cwd: Path | None = None,
                 env: dict[str, str] | None = None, timeout: float = TIMEOUT,
                 module: str = "embodichain", fresh: bool = False
                 ) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc-per-node=N -m embodichain ARGS` (gloo CPU workers; each
    worker is a fresh interpreter, the agent is forked warm unless `fresh`)."""
    return run_python_module("torch.distributed.run", "--standalone", "--nnodes=1",
                             f"--nproc-per-node={nproc}", "-m", module, *args, cwd=cwd,
                             env=env, timeout=timeout, fresh=fresh)


def start_endless_run(tmp_path: Path, run: Path, stdout: int = subprocess.DEVNULL
                      ) -> subprocess.Popen[str] | WarmPopen:
    """One process training the example "forever" (10M updates) into `run`, saving every
    500 updates, in the background: a live run for a test to look at, signal or kill."""
    from tests.support.recipes import write_recipe

    recipe = write_recipe(tmp_path / "endless.yaml", run, **{
        "trainer.max_updates": 10_000_000, "trainer.save_every": 500,
        "trainer.validate_every": 0, "trainer.log_every": 50})
    return start_python_module("embodichain", "train-sl", "--config", str(recipe),
                               "--no-progress", stdout=stdout, stderr=subprocess.PIPE,
                               text=True)


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n" \
                                 f"stderr:\n{proc.stderr}"


def workers_output(output: str) -> str:
    """What the workers printed under torchrun: the output before torchrun's own failure
    report, which repeats each worker's message from its elastic error file (design §9)."""
    return output.split("Traceback (most recent call last):", 1)[0]


def mark_then_wait_for_another(marker: Path, seconds: float = 2.0) -> None:
    """Append this process's pid to `marker`, then wait up to `seconds` for a second process
    to append too: two processes that nothing keeps apart both get here (both pids end up
    in the file); behind a lock, the second comes only after the first is done."""
    with marker.open("a") as f:
        f.write(f"{os.getpid()}\n")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(marker.read_text().split()) < 2:
        time.sleep(0.02)


def two_at_once(target: Callable[..., None], *args: object) -> list[object]:
    """Run `target(*args, barrier, results)` in two forked processes that the barrier
    releases together; what each put on `results`, once both exited 0."""
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, barrier, results)) for _ in range(2)]
    for w in workers:
        w.start()
    got = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
        assert w.exitcode == 0
    return got
