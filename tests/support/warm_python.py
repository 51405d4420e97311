"""`python -m MODULE ARGS` without paying the torch import each time (test harness only).

Every training process a test starts spends most of its time importing torch and
torch._dynamo (about 3.5 s of CPU on the 2-core CI machine), while the run itself takes a
fraction of that. A *warm interpreter* is one fresh `python` started once per pytest process
that imports only those third-party modules and then waits. For each launch it forks: the
child takes the caller's stdio, working directory, environment, `sys.path` (the directory,
then `PYTHONPATH`) and argv, runs the module with `runpy` exactly as `-m` does (embodichain
itself is imported fresh in every child), and ends through Python's own shutdown order
(non-daemon threads, atexit) with the same exit status or signal a fresh process would give.

A launch falls back to a fresh interpreter where the two could differ: an environment whose
import-time settings (`PYTHON*`, `TORCH*`, `OMP_*`, ...) are not the warm interpreter's, a
`PYTHONPATH` entry that would shadow a module already imported there, or `fresh=True` (tests
about start-up itself). `EMBODICHAIN_TESTS_FRESH=1` makes every launch fresh, which is how a
difference would be told apart (`tests/test_warm_python.py` compares the two on a real run).
`WarmPython.popen` starts a launch that a test holds on to, as `subprocess.Popen` does
(`WarmPopen`: pid, poll, wait, signals, pipes, communicate). The launched process is a
child of the warm interpreter, not of the test: its pid is real (signals, `killpg` after
`start_new_session`, its process tree), but a test about its parent stays fresh.

torchrun's workers are warm too (each would otherwise pay the imports again, twice per
launch): a warm `torch.distributed.run` first forks a *worker server* of its own, then runs
the agent, whose `Popen` of `python -u -m MODULE ...` asks that server to fork the worker
instead (`start_new_session` included). The worker's parent is the server, which dies with
the agent (`PR_SET_PDEATHSIG`), so a worker sees its launcher die as under plain torchrun:
its parent pid changes. A worker environment with other import-time settings than the
agent's (beyond what torchrun itself sets) gets a fresh interpreter. The CLI's own launcher
(`--nproc-per-node`) runs the same agent and gets the same.

That replaces torch's private `SubprocessHandler._popen`, so the warm interpreter first checks
that torch is what it was written for (`torch_mismatch`); where not, torch starts the workers
itself, fresh, and the session summary warns of it. Forked children share the hash seed and
what was imported before the fork (docs/development.md); torch's default generator is
reseeded in each, as a fresh process draws its own seed.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import inspect
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRELOAD = ("torch", "torch._dynamo", "torch.distributed.run")
# Environment variables read while those modules import (or by the interpreter at start-up):
# a launch whose values differ from the warm interpreter's gets a fresh interpreter.
IMPORT_TIME_PREFIXES = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "KMP_", "CUDA",
                        "NVIDIA", "LD_", "NCCL", "GLOO", "MALLOC", "LC_", "LANG")
# Read when used, not at import (torch sets TORCHINDUCTOR_CACHE_DIR in a process that compiled).
IMPORT_TIME_EXCEPT = {"PYTHONPATH", "PYTHONUNBUFFERED", "TORCHELASTIC_ERROR_FILE",
                      "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
# What torchrun's agent adds to a worker's environment beyond its own (read at run time).
WORKER_ENV_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
# What warm_popen replaces: `SubprocessHandler._popen(self, args, env)` (torch 2.6 to 2.13).
POPEN_PARAMETERS = ("self", "args", "env")
HANDLER_MODULE = "torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler"
PROC_USERS = (HANDLER_MODULE, "torch.distributed.elastic.multiprocessing.api")
ENVIRON = "environ"  # the warm interpreter's folder of each running launch's environment
STACKS_SIGNAL = signal.SIGUSR2  # a hung launch's processes print their stacks on it
_base_path: list[str] = []  # the warm interpreter's sys.path, which each launch starts from
_workdir = ""  # the warm interpreter's temporary directory (socket, log, worker sockets)
_workers_fresh: str | None = None  # why this warm interpreter leaves torchrun's workers fresh


def _import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items()
            if k.startswith(IMPORT_TIME_PREFIXES) and k not in IMPORT_TIME_EXCEPT}


# -- the client side (in the test process) ---------------------------------------------------

class Launch:
    """One launch asked of a server (the warm interpreter, or an agent's worker server):
    `pid`, `poll()` and `wait()` as a `Popen` has them, which is all torchrun's agent uses."""

    def __init__(self, address: str, argv: list[str], request: dict,
                 fds: tuple[int, int, int]) -> None:
        self.args, self.returncode = argv, None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(address)
        socket.send_fds(self._conn, [json.dumps(request).encode()], list(fds))
        self._received = b""
        self.pid = json.loads(self._line(None))["pid"]

    def _line(self, timeout: float | None) -> bytes:
        self._conn.settimeout(timeout)
        while b"\n" not in self._received:
            chunk = self._conn.recv(4096)
            if not chunk:  # the server died (a worker server with its agent)
                raise ConnectionError("the server of this launch is gone")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = json.loads(self._line(timeout))["status"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.close()
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            return self.wait()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def close(self) -> None:
        """Stop listening for the launch's end (the process itself is left alone)."""
        self._conn.close()


class WarmPopen:
    """A warm launch held by a test: the part of `subprocess.Popen`'s API the tests use.

    `stdin`, `stdout`, `stderr` take what `Popen` takes (None: this process's own, PIPE,
    DEVNULL, STDOUT for stderr, a file or a descriptor); the launch gets those descriptors
    themselves (SCM_RIGHTS), so a pipe ends when the process and all it started have closed it.
    """

    def __init__(self, address: str, module: str, args: list[str], *, cwd: Path,
                 env: dict[str, str], stdin: Any = None, stdout: Any = None,
                 stderr: Any = None, start_new_session: bool = False, text: bool = False
                 ) -> None:
        self.stdin = self.stdout = self.stderr = None
        self._text = text
        theirs: list[int] = []  # descriptors to close here once the launch has them
        fds = []
        for target, spec in enumerate((stdin, stdout, stderr)):
            if spec is None:
                fd = target
            elif spec == subprocess.STDOUT:
                fd = fds[1]
            elif spec == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                theirs.append(fd)
            elif spec == subprocess.PIPE:
                read, write = os.pipe()
                mine, fd = (write, read) if target == 0 else (read, write)
                theirs.append(fd)
                mode = ("w" if target == 0 else "r") + ("" if text else "b")
                setattr(self, ("stdin", "stdout", "stderr")[target],
                        open(mine, mode, buffering=-1 if text or target else 0))  # noqa: SIM115
            else:
                fd = spec if isinstance(spec, int) else spec.fileno()
            fds.append(fd)
        self.args = [sys.executable, "-m", module, *args]
        try:
            self._launch = Launch(address, self.args, {
                "module": module, "args": args, "cwd": str(cwd), "env": env,
                "new_session": start_new_session}, (fds[0], fds[1], fds[2]))
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = self._launch.pid
        self._output: dict[int, list[bytes]] = {}  # what communicate read so far, per fd
        self._read: dict[int, Any] = {}  # what it returned, per stream (ended: closed)

    @property
    def returncode(self) -> int | None:
        return self._launch.returncode

    def poll(self) -> int | None:
        return self._launch.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self._launch.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self._launch.send_signal(sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None  # noqa: A002
                    ) -> tuple[Any, Any]:
        """Read the piped output to its end, then wait for the exit, as `Popen` does
        (`TimeoutExpired` keeps what was read for the next call)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        pipes = [f for f in (self.stdout, self.stderr) if f is not None and not f.closed]
        for f in pipes:
            self._output.setdefault(f.fileno(), [])
        open_fds = {f.fileno(): f for f in pipes}
        while open_fds:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = select.select(list(open_fds), [], [], left)[0]
            if not ready:
                raise subprocess.TimeoutExpired(self.args, timeout)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    self._output[fd].append(chunk)
                else:
                    open_fds.pop(fd)
        results = []
        for f in (self.stdout, self.stderr):
            if f is None:
                results.append(None)
                continue
            if not f.closed:
                data = b"".join(self._output.pop(f.fileno(), []))
                f.close()
                self._read[id(f)] = data.decode().replace("\r\n", "\n").replace(
                    "\r", "\n") if self._text else data
            results.append(self._read.get(id(f)))
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results[0], results[1]

    def __enter__(self) -> WarmPopen:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


# What torch may use of a handler's `proc` (a `Popen`) for a `Launch` to stand in for it.
PROC_ATTRIBUTES = frozenset({"pid", "returncode", "args", "poll", "wait", "send_signal"})


def torch_mismatch(handler: type, users: list[str],
                   parameters: tuple[str, ...] = POPEN_PARAMETERS) -> str | None:
    """What in torch's `SubprocessHandler` (`handler`) differs from what the warm workers'
    `_popen` relies on (None: nothing); `users` are the sources that use a handler's `proc`."""
    name = "SubprocessHandler"
    popen = getattr(handler, "_popen", None)
    if not inspect.isfunction(popen):
        return f"{name} has no _popen method"
    found = tuple(inspect.signature(popen).parameters)
    if found != parameters:
        return f"{name}._popen takes ({', '.join(found)}), not ({', '.join(parameters)})"
    try:
        init, body = inspect.getsource(handler.__init__), inspect.getsource(popen)
    except (OSError, TypeError):
        return f"the source of {name} cannot be read"
    if not re.search(r"self\.proc\b[^=\n]*=\s*self\._popen\(", init):
        return f"{name}.__init__ does not set self.proc from self._popen(...)"
    for needed in ("self._stdout", "self._stderr", "start_new_session"):
        if needed not in body:
            return f"{name}._popen does not use {needed}"
    used = {a for source in users for a in re.findall(r"\.proc\.(\w+)", source)}
    if used - PROC_ATTRIBUTES:
        return "torch uses a handler's proc." + ", proc.".join(sorted(used - PROC_ATTRIBUTES))
    return None


def _check_torch(parameters: tuple[str, ...]) -> str | None:
    """`torch_mismatch` of the torch this interpreter imported."""
    import importlib

    try:
        handler = importlib.import_module(HANDLER_MODULE).SubprocessHandler
        users = [inspect.getsource(importlib.import_module(m)) for m in PROC_USERS]
    except (ImportError, AttributeError, OSError) as e:
        return f"{HANDLER_MODULE}.SubprocessHandler: {e}"
    return torch_mismatch(handler, users, parameters)


def launches_workers(module: str, args: list[str]) -> bool:
    """Whether `python -m module args` starts workers (torchrun, or the CLI's launcher)."""
    return module == "torch.distributed.run" or any(
        arg.startswith("--nproc-per-node") for arg in args)


class WarmPython:
    """One warm interpreter serving `run(module, args, ...)` launches for this process."""

    def __init__(self, env: dict[str, str], popen_parameters: tuple[str, ...] = POPEN_PARAMETERS
                 ) -> None:
        self.env = dict(env)
        self.env.pop("PYTHONPATH", None)
        self._dir = tempfile.mkdtemp(prefix="warm_python_")
        self.address = os.path.join(self._dir, "socket")
        self.log = open(os.path.join(self._dir, "server.log"), "w+b")  # noqa: SIM115
        self.server = subprocess.Popen(
            [sys.executable, __file__, self.address, ",".join(popen_parameters)], env=self.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=self._dir)
        assert self.server.stdout is not None
        ready = self.server.stdout.readline()
        if ready.strip() != b"ready":
            self.log.seek(0)
            raise RuntimeError("the warm interpreter did not start:\n" + self.log.read().decode())
        state = json.loads(self.server.stdout.readline())
        self.modules: set[str] = set(state["modules"])
        # Why torchrun's workers are started fresh (torch is not what warm_popen expects).
        self.workers_fresh: str | None = state["workers_fresh"]

    def can_run(self, env: dict[str, str]) -> bool:
        """Whether a launch with this environment behaves as a fresh interpreter would."""
        return self.why_fresh(env) is None

    def why_fresh(self, env: dict[str, str]) -> str | None:
        """What in `env` a warm launch could not honour (None: nothing)."""
        mine, theirs = _import_time_env(self.env), _import_time_env(env)
        if mine != theirs:
            return "import-time settings " + ", ".join(sorted(
                k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k)))
        for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
            try:
                names = {Path(n).stem for n in os.listdir(entry)}
            except OSError:
                continue
            if names & self.modules:
                return "PYTHONPATH shadows " + ", ".join(sorted(names & self.modules))
        return None

    def run(self, module: str, args: list[str], *, cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess[str]:
        """`python -m module args` with its output captured, as `subprocess.run` returns it."""
        argv = [sys.executable, "-m", module, *args]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
                open(os.devnull, "rb") as stdin:
            launch = Launch(self.address, argv, {"module": module, "args": args,
                                                 "cwd": str(cwd), "env": env},
                            (stdin.fileno(), out.fileno(), err.fileno()))
            try:
                status = launch.wait(timeout)
            except subprocess.TimeoutExpired:
                dump_stacks(launch.pid, err)  # where it hung, for the failure report
                os.kill(launch.pid, signal.SIGKILL)
                launch.close()
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(argv, status, out.read().decode(),
                                               err.read().decode())

    def popen(self, module: str, args: list[str], *, cwd: Path, env: dict[str, str],
              **popen_kwargs: Any) -> WarmPopen:
        """`subprocess.Popen([python, "-m", module, *args], ...)`, forked warm (`WarmPopen`
        takes stdin, stdout, stderr, start_new_session and text)."""
        return WarmPopen(self.address, module, args, cwd=cwd, env=env, **popen_kwargs)

    def close(self) -> None:
        if self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()  # the server exits when its stdin ends
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
        self.log.close()
        shutil.rmtree(self._dir, ignore_errors=True)  # its socket and server log


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        found.append(current := queue.pop(0))
        queue += children.get(current, [])
    return found


def dump_stacks(pid: int, err: Any) -> None:
    """Ask a hung launch's processes for their stacks (faulthandler, registered in every
    warm child) and print them, with the process tree, to this test's stderr, which pytest
    shows with the failure: a hang in CI is then diagnosable from its log alone."""
    commands = []
    for process in descendants(pid):
        with contextlib.suppress(OSError, ValueError):
            status = Path(f"/proc/{process}/status").read_text()
            caught = int(status.split("SigCgt:")[1].split()[0], 16)
            command = Path(f"/proc/{process}/cmdline").read_bytes().replace(b"\0", b" ")
            commands.append(f"{process}: {command.decode(errors='replace')[:200]}")
            if caught & (1 << (STACKS_SIGNAL - 1)):  # only where faulthandler listens
                os.kill(process, STACKS_SIGNAL)
    time.sleep(2)
    err.seek(0)
    print("the launch timed out; its processes:\n" + "\n".join(commands)
          + "\n-- its stderr, with each process's stacks at the end --\n"
          + err.read().decode(errors="replace")[-30000:], file=sys.stderr)


_warm: WarmPython | None = None


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def environ_of(pid: int) -> dict[str, str]:
    """The environment process `pid` was started with: a warm launch's as it asked for it
    (its /proc/PID/environ is the warm interpreter's), any other process's from /proc."""
    if _warm is not None:
        with contextlib.suppress(OSError):
            record = json.loads(Path(_warm._dir, ENVIRON, str(pid)).read_text())
            if record["started"] == _start_time(pid):  # not another process with that pid
                return record["env"]
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def warm_python(env: dict[str, str]) -> WarmPython:
    """The warm interpreter of this process, started on first use with `env`."""
    global _warm
    if _warm is None:
        _warm = WarmPython(env)
        atexit.register(_warm.close)
    return _warm


def fresh_only() -> bool:
    return os.environ.get("EMBODICHAIN_TESTS_FRESH") == "1"


# -- the server side (the warm interpreter) --------------------------------------------------

def _main(address: str, popen_parameters: tuple[str, ...]) -> None:
    """The warm interpreter: import, check torch, say so, serve until the test lets go."""
    import importlib

    global _workdir, _workers_fresh
    for name in PRELOAD:
        importlib.import_module(name)
    _workers_fresh = _check_torch(popen_parameters)
    # What was imported is kept out of every later collection: a child's collections would
    # otherwise visit (and so copy, page by page) the whole imported heap it shares with this
    # process, about 1.5 s of CPU per launch. Those objects live as long as the process anyway.
    gc.freeze()
    _base_path[:] = sys.path
    _workdir = os.path.dirname(address)
    os.mkdir(os.path.join(_workdir, ENVIRON))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    sys.stdout.write("ready\n" + json.dumps({
        "modules": sorted({m.split(".")[0] for m in sys.modules}),
        "workers_fresh": _workers_fresh}) + "\n")
    sys.stdout.flush()
    _serve(listener, sys.stdin.fileno(), orphan_on_close=False)


def _serve(listener: socket.socket, control: int, *, orphan_on_close: bool) -> None:
    """Fork a launch for each request on `listener` and report its end, until `control`
    (a pipe from the client) ends; then kill what is still running, or leave it to run
    on (`orphan_on_close`: torchrun's workers outlive a dead agent)."""
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection awaiting its status
    # Told its status, a child stays a zombie (still in its process group) until the client
    # has read it and closed: torchrun's agent signals a worker's group (killpg) while its
    # poll() says running, which a child reaped before the client knew would turn into ESRCH.
    told: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, control], [], [], 0.02)
        if control in readable and not os.read(control, 1):
            break  # the client is gone or done
        if listener in readable:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in [conn, *waiting.values()]:
                    other.close()
                _child(json.loads(message), fds)  # never returns
            for fd in fds:
                os.close(fd)
            _record_environ(pid, json.loads(message)["env"])
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = conn
        for pid in list(waiting):
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if ended is not None and ended.si_pid == pid:
                code = (ended.si_status if ended.si_code == os.CLD_EXITED
                        else -ended.si_status)  # killed (or dumped) by a signal
                conn = told[pid] = waiting.pop(pid)
                try:
                    conn.sendall(json.dumps({"status": code}).encode() + b"\n")
                except OSError:
                    pass  # the caller timed out and left: reaped below
        for pid, conn in list(told.items()):
            if select.select([conn], [], [], 0)[0]:  # the client read its status and closed
                _reap(pid, told.pop(pid))
    if orphan_on_close:
        os._exit(0)
    for pid, conn in told.items():
        _reap(pid, conn)
    for pid in waiting:
        os.kill(pid, signal.SIGKILL)


def _reap(pid: int, conn: socket.socket) -> None:
    """A child whose end its client knows: reaped, its recorded environment dropped."""
    os.waitpid(pid, 0)
    conn.close()
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(_workdir, ENVIRON, str(pid)))


def _record_environ(pid: int, env: dict[str, str]) -> None:
    """Keep a launch's environment where `environ_of` finds it: a forked child's
    /proc/PID/environ still shows the warm interpreter's."""
    path = os.path.join(_workdir, ENVIRON, str(pid))
    with open(path + ".part", "w") as f:
        json.dump({"started": _start_time(pid), "env": env}, f)
    os.replace(path + ".part", path)


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: become `python -m MODULE ARGS`. What the module raises (SystemExit
    included) goes up to the interpreter, which ends the process as it ends a fresh one."""
    import importlib
    import io
    import runpy

    if request.get("new_session"):
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    extra = [os.path.abspath(p) for p in
             filter(None, request["env"].get("PYTHONPATH", "").split(os.pathsep))]
    sys.path[:] = [os.getcwd(), *extra, *_base_path[1:]]
    importlib.invalidate_caches()
    unbuffered = bool(request.get("unbuffered") or request["env"].get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace",
                                  write_through=True)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.unregister(STACKS_SIGNAL)  # a fork's copy, which register would not renew
    for name in ("SIGTERM", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    # A launch that times out is asked for every thread's stack first (dump_stacks): its
    # processes (and the data workers they fork, which inherit this) write them to stderr.
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    sys.argv = [request["module"], *request["args"]]
    sys.modules.pop(request["module"], None)  # -m executes it afresh as __main__
    sys.modules["torch"].default_generator.seed()  # a fresh process draws its own seed
    if _workers_fresh is None and launches_workers(request["module"], request["args"]):
        _fork_workers_warm()
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


# -- torchrun's workers (in a warm agent) ---------------------------------------------------

def _fork_workers_warm() -> None:
    """Start this agent's worker server and route its workers' `Popen` there."""
    import ctypes

    from torch.distributed.elastic.multiprocessing.subprocess_handler import (
        subprocess_handler,
    )

    address = os.path.join(tempfile.mkdtemp(prefix="workers_", dir=_workdir), "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    control, keep_open = os.pipe()  # ends when the agent does, however it ends
    agent, env = os.getpid(), dict(os.environ)
    if os.fork() == 0:
        os.close(keep_open)
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != agent:
            os._exit(0)
        # In the agent's process group, where a fresh torchrun has no such process: a signal
        # to the group (Ctrl-C, `kill -- -PGID`) is for the agent and the workers' own
        # handlers, which each forked worker sets again (_child).
        for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1"):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        _serve(listener, control, orphan_on_close=True)
    listener.close()
    os.close(control)
    expected = _import_time_env(env)
    popen = subprocess_handler.SubprocessHandler._popen

    def warm_popen(handler, args: tuple, worker_env: dict[str, str]):  # noqa: ANN001, ANN202
        own = {k: v for k, v in _import_time_env(worker_env).items()
               if not k.startswith(WORKER_ENV_PREFIXES)}
        if (args[0] != sys.executable or tuple(args[1:3]) != ("-u", "-m") or own != expected
                or worker_env.get("PYTHONPATH") != env.get("PYTHONPATH")):
            return popen(handler, args, worker_env)
        out = handler._stdout.fileno() if handler._stdout else 1
        err = handler._stderr.fileno() if handler._stderr else 2
        return Launch(address, list(args), {
            "module": args[3], "args": list(args[4:]), "cwd": os.getcwd(), "env": worker_env,
            "new_session": True, "unbuffered": True}, (0, out, err))

    subprocess_handler.SubprocessHandler._popen = warm_popen


if __name__ == "__main__":
    _main(sys.argv[1], tuple(sys.argv[2].split(",")))
