"""The test harness's warm interpreter (tests/support/warm_python.py) against a fresh one.

Most tests start the CLI through it; these catch a warm launch that differs from
`python -m embodichain` in what a test can see: exit status, output, the files a run
writes, the environment and path the module runs with, or a fallback that did not happen.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support import processes, run_cli, run_torchrun, worker_env, write_recipe
from tests.support.processes import (
    child_pids,
    launch_summary,
    run_python_module,
    start_python_module,
)
from tests.support.state_compare import assert_training_state_equal
from tests.support.warm_python import WarmPython, fresh_only, torch_mismatch, warm_python


def _without_run_identity(text: str, run: Path) -> str:
    """The summary without what names the run or measures the machine (time, memory)."""
    text = text.replace(str(run), "RUN")
    text = re.sub(r"[0-9.]+ GiB", "M", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "ID", text)
    return re.sub(r"[0-9.]+ s wall, [0-9.]+ updates/s", "T", text)


def test_a_warm_run_equals_a_fresh_one(tmp_path: Path) -> None:
    """Catches a warm child that trains differently (threads, seeds, imports), prints
    differently, or exits with another status than a fresh interpreter."""
    outputs = {}
    for fresh in (True, False):
        run = tmp_path / f"fresh_{fresh}"
        recipe = write_recipe(tmp_path / f"{fresh}.yaml", run, **{"trainer.max_updates": 20,
                                                                   "trainer.save_every": 10})
        proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", fresh=fresh)
        assert proc.returncode == 0, proc.stderr
        outputs[fresh] = (_without_run_identity(proc.stdout, run),
                          _without_run_identity(proc.stderr, run), run)
    assert outputs[True][:2] == outputs[False][:2]
    assert assert_training_state_equal(outputs[True][2] / "last.pt",
                                       outputs[False][2] / "last.pt") > 0


def _worker_probe(tmp_path: Path) -> dict[str, str]:
    """A module `worker_probe` for torchrun's workers: each prints its rank, whether torch was
    imported before it ran (a forked worker), whether it leads its session, and its torch seed;
    `fail` ends rank 1 with 3, `kill P` has rank 0 SIGKILL the agent and write to P whether it
    saw its parent change. Returns the environment that finds it."""
    probe = tmp_path / "lib" / "worker_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import json, os, signal, sys, time\n"
        "rank, parent = os.environ['RANK'], os.getppid()\n"
        "seen = {'rank': rank, 'warm': 'torch' in sys.modules,\n"
        "        'leader': os.getsid(0) == os.getpid()}\n"
        "if seen['warm']:\n"
        "    seen['seed'] = sys.modules['torch'].initial_seed()\n"
        "if sys.argv[1] == 'kill' and rank == '0':\n"
        "    agent = int(open(f'/proc/{parent}/stat').read().rsplit(')', 1)[1].split()[1])\n"
        "    os.kill(agent, signal.SIGKILL)\n"
        "    deadline = time.monotonic() + 10\n"
        "    while os.getppid() == parent and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    seen['orphaned'] = os.getppid() != parent\n"
        "    open(sys.argv[2] + '.part', 'w').write(json.dumps(seen))\n"
        "    os.replace(sys.argv[2] + '.part', sys.argv[2])\n"
        "os.write(1, (json.dumps(seen) + '\\n').encode())  # one write: the ranks' lines whole\n"
        "sys.exit(3 if sys.argv[1] == 'fail' and rank == '1' else 0)\n")
    return worker_env(PYTHONPATH=str(probe.parent))


def _probed(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    return sorted((json.loads(line) for line in proc.stdout.splitlines()),
                  key=lambda s: s["rank"])


def test_torchrun_workers_are_forked_warm_and_see_their_agent_die(tmp_path: Path) -> None:
    """Catches torchrun workers that pay the imports again (fresh interpreters: also a torch
    check that wrongly finds this torch unexpected), that share the agent's session (torchrun
    starts each in a new one), that share torch's random seed (a fresh process draws its own),
    whose exit status torchrun does not see, or whose parent outlives a SIGKILLed agent (the
    product's launcher watch would never fire: tests/recovery/test_launcher_death.py runs it
    with fresh workers)."""
    if fresh_only():
        pytest.skip("EMBODICHAIN_TESTS_FRESH=1 makes every launch fresh")
    unexpected = warm_python(worker_env()).workers_fresh
    assert unexpected is None, f"torch is not what the warm workers expect: {unexpected}"
    env = _worker_probe(tmp_path)
    proc = run_torchrun("fail", module="worker_probe", cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "exitcode  : 3" in proc.stderr, proc.stderr
    seen = _probed(proc)
    seeds = {s.pop("seed", None) for s in seen}
    assert seen == [{"rank": r, "warm": True, "leader": True} for r in "01"], proc.stdout
    assert len(seeds) == 2, f"both workers drew torch seed {seeds}"
    killed = run_torchrun("kill", str(tmp_path / "killed.json"), module="worker_probe",
                          cwd=tmp_path, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    deadline = time.monotonic() + 15
    while not (tmp_path / "killed.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert json.loads((tmp_path / "killed.json").read_text())["orphaned"]


# Stand-ins for torch's SubprocessHandler, each unlike it in one thing the warm workers use.
class _AsTorch:
    def __init__(self, entrypoint: str, args: tuple, env: dict) -> None:
        self._stdout = self._stderr = None
        self.proc = self._popen((entrypoint, *args), env)

    def _popen(self, args: tuple, env: dict):  # noqa: ANN202
        return subprocess.Popen(args, env=env, stdout=self._stdout, stderr=self._stderr,
                                start_new_session=True)


class _NoPopen:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(["true"])


class _OtherParameters(_AsTorch):
    def _popen(self, cmd: tuple, env: dict, numa: object = None):  # noqa: ANN202
        return subprocess.Popen(cmd, env=env, stdout=self._stdout, stderr=self._stderr,
                                start_new_session=True)


class _ProcElsewhere(_AsTorch):
    def __init__(self, entrypoint: str, args: tuple, env: dict) -> None:
        self._stdout = self._stderr = None
        self._proc = self._popen((entrypoint, *args), env)


class _SameSession(_AsTorch):
    def _popen(self, args: tuple, env: dict):  # noqa: ANN202
        return subprocess.Popen(args, env=env, stdout=self._stdout, stderr=self._stderr)


def test_torch_internals_the_warm_workers_replace_are_checked() -> None:
    """Catches a check that lets through a SubprocessHandler without `_popen`, whose `_popen`
    takes other parameters or starts no new session, whose `__init__` does not keep `_popen`'s
    result as `self.proc`, or whose users call a `proc` method a `Launch` lacks: the warm
    workers would break every distributed test instead of falling back to fresh ones."""
    uses = ["handler.proc.poll()\nos.killpg(self.proc.pid, sig)\nself.proc.wait(1)\n"]
    assert torch_mismatch(_AsTorch, uses) is None
    assert "no _popen" in torch_mismatch(_NoPopen, uses)
    assert "takes (self, cmd, env, numa), not (self, args, env)" in \
        torch_mismatch(_OtherParameters, uses)
    assert "self.proc" in torch_mismatch(_ProcElsewhere, uses)
    assert "start_new_session" in torch_mismatch(_SameSession, uses)
    assert "proc.terminate" in torch_mismatch(_AsTorch, [*uses, "handler.proc.terminate()"])


def test_a_torch_it_does_not_expect_gets_fresh_workers_and_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a warm interpreter that forks torchrun's workers although torch's
    `SubprocessHandler._popen` is not what it expects (simulated by expecting other
    parameters), or a fallback that the session summary does not count and warn of."""
    monkeypatch.setattr(processes, "fresh_only", lambda: False)  # also under the fresh pass
    warm = WarmPython(worker_env(), popen_parameters=("self", "argv", "env"))
    try:
        assert warm.workers_fresh == "SubprocessHandler._popen takes (self, args, env), " \
                                     "not (self, argv, env)"
        launches: Counter[str] = Counter()
        monkeypatch.setattr(processes, "warm_python", lambda env: warm)
        monkeypatch.setattr(processes, "LAUNCHES", launches)
        proc = run_torchrun("fail", module="worker_probe", cwd=tmp_path,
                            env=_worker_probe(tmp_path))
    finally:
        warm.close()
    assert proc.returncode == 1 and "exitcode  : 3" in proc.stderr, proc.stderr
    assert _probed(proc) == [{"rank": r, "warm": False, "leader": True} for r in "01"]
    reason = f"({warm.workers_fresh})"
    assert launches == {f"{processes.WORKERS_FRESH} {reason}": 1}
    warning = [line for line in launch_summary(launches) if line.startswith("WARNING")]
    assert len(warning) == 1 and warm.workers_fresh in warning[0], warning


def test_a_torchrun_run_with_warm_workers_equals_a_fresh_one(tmp_path: Path) -> None:
    """Catches forked workers that train differently from fresh ones (seeds, threads,
    imports) or print otherwise."""
    outputs = {}
    for fresh in (True, False):
        run = tmp_path / f"fresh_{fresh}"
        recipe = write_recipe(tmp_path / f"{fresh}.yaml", run, **{"trainer.max_updates": 20,
                                                                   "trainer.save_every": 10})
        proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                            fresh=fresh)
        assert proc.returncode == 0, proc.stderr
        outputs[fresh] = (_without_run_identity(proc.stdout, run), run)
    assert outputs[True][0] == outputs[False][0]
    assert assert_training_state_equal(outputs[True][1] / "last.pt",
                                       outputs[False][1] / "last.pt") > 0


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_exit_status_environment_and_path_are_the_callers(tmp_path: Path) -> None:
    """Catches a warm child that keeps the warm interpreter's directory, environment or
    `sys.path`, or reports an uncaught exception, an exit code or a KeyboardInterrupt
    otherwise than a fresh interpreter does."""
    probe = tmp_path / "lib" / "probe_mod.py"
    probe.parent.mkdir()
    probe.write_text(
        "import json, os, sys\n"
        "mode = sys.argv[1]\n"
        "if mode == 'report':\n"
        "    print(json.dumps({'cwd': os.getcwd(), 'path0': sys.path[0],\n"
        "                      'lib': sys.path[1], 'var': os.environ.get('PROBE_VAR'),\n"
        "                      'argv': sys.argv, 'main': __name__}))\n"
        "elif mode == 'raise':\n"
        "    raise ValueError('on purpose')\n"
        "elif mode == 'interrupt':\n"
        "    raise KeyboardInterrupt\n"
        "else:\n"
        "    sys.exit(int(mode))\n")
    env = worker_env(PYTHONPATH=str(probe.parent), PROBE_VAR="set")
    for mode in ("report", "raise", "interrupt", "7"):
        fresh = run_python_module("probe_mod", mode, cwd=tmp_path, env=env, fresh=True)
        warm = run_python_module("probe_mod", mode, cwd=tmp_path, env=env)
        assert warm.returncode == fresh.returncode, (mode, warm.stderr, fresh.stderr)
        assert warm.stdout == fresh.stdout, mode
        assert fresh.stderr.splitlines()[-1:] == warm.stderr.splitlines()[-1:], mode
    assert run_python_module("probe_mod", "interrupt", cwd=tmp_path, env=env).returncode == \
        -signal.SIGINT
    report = json.loads(run_python_module("probe_mod", "report", cwd=tmp_path, env=env).stdout)
    assert report["cwd"] == str(tmp_path) and report["path0"] == str(tmp_path)
    assert (report["lib"], report["var"], report["main"]) == (str(probe.parent), "set",
                                                              "__main__")
    assert report["argv"] == [str(probe), "report"]


def test_an_environment_it_cannot_match_gets_a_fresh_interpreter(tmp_path: Path) -> None:
    """Catches a warm launch where a `PYTHONPATH` entry shadows a module the warm interpreter
    has already imported (numpy here), or an import-time setting differs."""
    warm = warm_python(worker_env())
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "numpy.py").write_text("raise ImportError('no numpy here')\n")
    assert warm.can_run(worker_env())
    assert not warm.can_run(worker_env(PYTHONPATH=str(shadow)))
    assert not warm.can_run(worker_env(OMP_NUM_THREADS="2"))
    assert not warm.can_run(worker_env(PYTHONHASHSEED="3"))
    (shadow / "uses_numpy.py").write_text("import numpy\n")
    proc = run_python_module("uses_numpy", cwd=tmp_path, env=worker_env(PYTHONPATH=str(shadow)))
    assert proc.returncode == 1 and "no numpy here" in proc.stderr, proc.stderr


def test_the_warm_interpreter_ends_when_its_test_process_lets_go(tmp_path: Path) -> None:
    """Catches a warm interpreter left running after pytest (it waits on its stdin, which
    ends with the test process), or one that leaves a launch it forked running."""
    warm = WarmPython(worker_env())
    endless = tmp_path / "endless_mod.py"
    endless.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    try:
        proc = warm.run("endless_mod", [], cwd=tmp_path, env=worker_env(), timeout=0.5)
    except subprocess.TimeoutExpired:
        proc = None
    assert proc is None, "an endless launch was not stopped at its timeout"
    warm.close()
    assert warm.server.returncode == 0


def _popen_probe(tmp_path: Path) -> dict[str, str]:
    """A module `popen_probe`: `exit N` ends with N; `talk` prints to both streams; `hold`
    starts two `sleep` children (the launch's workers), prints `ready`, then waits."""
    probe = tmp_path / "plib" / "popen_probe.py"
    probe.parent.mkdir()
    probe.write_text(
        "import subprocess, sys, time\n"
        "if sys.argv[1] == 'exit':\n"
        "    sys.exit(int(sys.argv[2]))\n"
        "if sys.argv[1] == 'talk':\n"
        "    print('out line'); print('err line', file=sys.stderr); sys.exit(0)\n"
        "kids = [subprocess.Popen(['sleep', '60']) for _ in range(2)]\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")
    return worker_env(PYTHONPATH=str(probe.parent))


def _started(mode: str, tmp_path: Path, env: dict[str, str], fresh: bool,
             **popen_kwargs: object) -> subprocess.Popen:
    proc = start_python_module("popen_probe", *mode.split(), cwd=tmp_path, env=env,
                               fresh=fresh, **popen_kwargs)
    assert isinstance(proc, subprocess.Popen) == (fresh or fresh_only())
    return proc


def test_a_warm_popen_ends_as_a_fresh_one(tmp_path: Path) -> None:
    """Catches a launch held by a test (`start_python_module`) whose exit status differs
    from a fresh `Popen` child's: a normal exit, an exit code, SIGKILL and SIGTERM sent to
    its pid by the test (a negative signal number), or whose pid is not the process's."""
    env = _popen_probe(tmp_path)
    for fresh in (True, False):
        codes = []
        for mode in ("exit 0", "exit 7"):
            codes.append(_started(mode, tmp_path, env, fresh).wait(timeout=60))
        for sig in (signal.SIGKILL, signal.SIGTERM):
            proc = _started("hold", tmp_path, env, fresh, stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline() == "ready\n"  # read while it runs
            proc.send_signal(sig)
            codes.append(proc.wait(timeout=60))
            proc.stdout.close()
        assert codes == [0, 7, -signal.SIGKILL, -signal.SIGTERM], (fresh, codes)
    assert run_python_module("popen_probe", "exit", "3", cwd=tmp_path, env=env).returncode == 3


def test_killpg_of_a_new_session_stops_its_workers_and_closes_its_pipe(tmp_path: Path) -> None:
    """Catches a warm launch with `start_new_session` that is not its own process group's
    leader (killpg would miss it, or hit the warm interpreter or pytest), whose children are
    not under its pid, whose stdout pipe stays open after it and its children ended, or a
    warm interpreter that serves no more launches after one was killed; and `communicate`
    that loses a stream or mixes them otherwise than STDOUT asks."""
    env = _popen_probe(tmp_path)
    proc = _started("hold", tmp_path, env, False, stdout=subprocess.PIPE, text=True,
                    start_new_session=True)
    assert proc.stdout.readline() == "ready\n"
    workers = child_pids(proc.pid)
    assert len(workers) == 2 and os.getpgid(proc.pid) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert proc.stdout.read() == ""  # EOF: no process holds the pipe any more
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text()
              .rsplit(")", 1)[1].split()[0] for p in workers):
        assert time.monotonic() < deadline, "the launch's children outlived its killpg"
        time.sleep(0.02)
    for fresh in (True, False):
        talk = _started("talk", tmp_path, env, fresh, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True)
        assert talk.communicate(timeout=60) == ("out line\n", "err line\n")
        merged = _started("talk", tmp_path, env, fresh, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
        assert merged.communicate(timeout=60) == (b"out line\nerr line\n", None)
        assert merged.returncode == 0
