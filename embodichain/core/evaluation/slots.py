"""A rank's environment slots: where its episodes run, one after another in each slot.

`LocalSlot` (`evaluation.vector: sync`) steps its environment in this process, as gymnasium's
SyncVectorEnv does; `ProcessSlot` (`async`) in a worker process of its own (from a fork
server, never forked from this process), as AsyncVectorEnv does, so that slow simulators
step in parallel and a step that hangs is cut off at the episode's wall-clock limit (the
process is killed). The limit counts the
environment's own time (its resets and steps), not the policy's, the other slots', nor the
rendering of a filmed episode's frames (filming never changes an outcome, R-EVAL-5).
Unlike gymnasium's vector environments, a slot never resets by itself: the evaluation
resets it with the next episode's seed, and a slot whose environment failed is rebuilt
before its next episode, so the fault stays in its episode. Every command is sent to every
slot before any answer is awaited (`send`, then `receive`), so process slots step together.

`check_renders` makes one frame where the films will be made (a slot of the evaluation's
kind: an async slot's renderer, e.g. MuJoCo's OpenGL context, is never created in the
evaluating process, which may hold OpenGL and OpenMP state), before training or `eval --videos`: an
environment that cannot render is refused then, naming `MUJOCO_GL` (R-EVAL-5).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from abc import ABC, abstractmethod
from typing import Any

from embodichain.core.errors import UsageError
from embodichain.core.evaluation.envs import EnvSpec
from embodichain.core.evaluation.video import NoFrame
from embodichain.core.evaluation.worker import Answer, EnvHost, serve

TIMEOUT = "timeout"
BUILD_S = 600.0  # how long a new process may take to start and build its environment
RENDER_S = 120.0  # how long a frame may take to render, beyond the episode's limit


class Slot(ABC):
    """One environment: `send` a command, then `receive` its answer by a deadline."""

    @abstractmethod
    def send(self, command: str, argument: Any, render: bool) -> None: ...

    @abstractmethod
    def receive(self, budget: float) -> Answer:
        """`("ok", result, seconds)`, `("error", reason, seconds)`, or `(TIMEOUT, reason,
        seconds)` when the answer has not come `budget` seconds after `send`."""

    @abstractmethod
    def recover(self) -> None:
        """After a fault: the next episode gets a new environment."""

    @abstractmethod
    def close(self) -> None: ...


class LocalSlot(Slot):
    """An environment stepped in this process (the answer is ready when `send` returns; a
    step cannot be interrupted, so a step past the deadline is judged when it returns)."""

    def __init__(self, spec: EnvSpec) -> None:
        self.host = EnvHost(spec)
        self.answer: Answer | None = None

    def send(self, command: str, argument: Any, render: bool) -> None:
        self.answer = self.host.run(command, argument, render)

    def receive(self, budget: float) -> Answer:
        answer, self.answer = self.answer, None
        assert answer is not None
        return answer

    def recover(self) -> None:
        self.host.rebuild()

    def close(self) -> None:
        self.host.close()


WORKER_MODULE = "embodichain.core.evaluation.worker"


def _context() -> Any:
    """forkserver where there is one, else spawn; never fork. The evaluating process has
    gloo's and OpenMP's threads (and maybe CUDA) by the time it evaluates, and a fork
    copies their locks in whatever state they are in. The fork server is a fresh
    interpreter started once per evaluating process, holding the worker's module (not
    the main script: forkserver and spawn would re-import it); each slot's process is
    forked from it and imports its environment's modules itself (the spec names them by
    import path, so it pickles)."""
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" not in methods:
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WORKER_MODULE])
    return context


class ProcessSlot(Slot):
    """An environment in a worker process of its own, started on first use and after a
    fault (the failed process is ended)."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.process: Any = None
        self.connection: Any = None
        self.sent = 0.0
        self.fresh = False  # this command also builds the environment (allowed BUILD_S)
        self.fresh_next = False  # the environment was dropped: the next command builds it
        self.rendering = False  # this command also renders a frame (allowed RENDER_S)
        self.dead = False  # timed out or gone: a new process, not a new environment

    def _start(self) -> None:
        context = _context()
        parent, child = context.Pipe()
        self.process = context.Process(target=serve, args=(child, self.spec, list(sys.path),
                                                          dict(os.environ)),
                                       daemon=True,
                                       name="embodichain-eval-env")
        self.process.start()
        child.close()
        self.connection = parent

    def send(self, command: str, argument: Any, render: bool) -> None:
        self.fresh = self.fresh_next or self.process is None
        self.fresh_next = False
        self.rendering = render
        if self.process is None:
            self._start()
        self.sent = time.monotonic()
        try:
            self.connection.send((command, argument, render))
        except (OSError, ValueError) as exc:  # the worker died (receive says so)
            self.connection.close()
            self.connection = _Broken(f"the environment process is gone ({exc})")
            self.dead = True

    def receive(self, budget: float) -> Answer:
        if isinstance(self.connection, _Broken):
            return "error", self.connection.reason, 0.0
        try:
            allowed = (budget + (BUILD_S if self.fresh else 0.0)
                       + (RENDER_S if self.rendering else 0.0))
            if not self.connection.poll(max(0.0, self.sent + allowed - time.monotonic())):
                self.dead = True
                return (TIMEOUT, "the environment did not answer within episode_timeout_s",
                        time.monotonic() - self.sent)
            return self.connection.recv()
        except (EOFError, OSError):
            self.dead = True
            code = self.process.exitcode if self.process is not None else None
            return ("error", f"the environment process ended (exit code {code})",
                    time.monotonic() - self.sent)

    def recover(self) -> None:
        if self.dead or self.connection is None:  # it may be inside a step that never returns
            self.close(kill=True)
            return
        try:  # the process is well: it builds a new environment
            self.connection.send(("rebuild", None, False))
            self.fresh_next = True
        except (OSError, ValueError):
            self.close(kill=True)

    def close(self, kill: bool = False) -> None:
        process, connection = self.process, self.connection
        self.process = self.connection = None
        self.dead = False
        if connection is not None and not isinstance(connection, _Broken):
            if not kill:
                with contextlib.suppress(Exception):
                    connection.send(("close", None, False))
            connection.close()
        if process is not None:
            if not kill:
                process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join()


class _Broken:
    """A slot's connection that failed on send: why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def make_slots(spec: EnvSpec, count: int, vector: str) -> list[Slot]:
    """`count` slots of the kind `evaluation.vector` names."""
    kind = ProcessSlot if vector == "async" else LocalSlot
    return [kind(spec) for _ in range(count)]


GL_FIX = ("MuJoCo renders with the OpenGL backend that MUJOCO_GL names (now {now}): set "
          "MUJOCO_GL=egl (headless: a GPU driver or Mesa's EGL) or MUJOCO_GL=osmesa "
          "(software, needs libOSMesa), or glfw with a display")


def check_renders(spec: EnvSpec, vector: str, asked: str, none: str,
                  budget: float = 60.0) -> None:
    """Reset one environment (`spec.render`) in a slot of the `vector` kind and render its
    first frame; refuse (UsageError, exit 2) one that cannot, naming MUJOCO_GL and the fix.
    `asked` names what wants films, `none` how to want none."""
    slot = make_slots(spec, 1, vector)[0]
    try:
        slot.send("reset", 0, True)
        status, result, _ = slot.receive(budget)
    finally:
        slot.close()
    problem = result if status != "ok" else (
        result[-1].reason if isinstance(result[-1], NoFrame) else None)
    if problem is not None:
        now = os.environ.get("MUJOCO_GL", "unset")
        raise UsageError(f"{asked}: episodes are to be filmed, but evaluation.env "
                         f"{spec.name!r} cannot render a frame (render_mode='rgb_array'): "
                         f"{problem}. {GL_FIX.format(now=now)}; or film nothing ({none}). "
                         "Nothing was started.")
