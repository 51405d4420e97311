"""One environment and the commands it answers, in this process or a worker process of its own.

`EnvHost` runs a command (`reset`, `step`) on its environment and answers `("ok", result,
seconds)` or `("error", reason, seconds)`, `seconds` the environment's own time (what the
episode's wall-clock limit counts): whatever the environment raises stays in the answer,
so a fault is its episode's, never the evaluation's. The frame of a filmed episode is
rendered after the command, outside `seconds`, and a renderer's fault is the film's alone
(a `NoFrame` in the frame's place, R-EVAL-5): filming never changes an episode's outcome.
`serve` is the loop of a worker process (`evaluation.vector: async`): it answers commands
from its pipe until told to close or the pipe closes (the evaluating process went away).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from embodichain.core.evaluation.envs import EnvSpec, make_env
from embodichain.core.evaluation.video import NoFrame, rgb_frame

Answer = tuple[str, Any, float]


def fault(exc: BaseException) -> str:
    """An exception as an episode's failure reason."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class EnvHost:
    """An environment, built on first use and again after `rebuild`."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec = spec
        self.env: Any = None

    def run(self, command: str, argument: Any, render: bool) -> Answer:
        started = time.perf_counter()
        try:
            if self.env is None:  # building it is not the episode's time
                self.env = make_env(self.spec)
                started = time.perf_counter()
            if command == "reset":
                obs, info = self.env.reset(seed=int(argument))
                result: tuple[Any, ...] = (obs, dict(info))
            elif command == "step":
                obs, reward, terminated, truncated, info = self.env.step(argument)
                result = (obs, float(reward), bool(terminated), bool(truncated), dict(info))
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception as exc:
            return "error", fault(exc), time.perf_counter() - started
        seconds = time.perf_counter() - started
        return "ok", (*result, self._frame() if render else None), seconds

    def _frame(self) -> Any:
        """The frame now, as uint8 `[H, W, 3]`, or why there is none (`NoFrame`)."""
        try:
            return rgb_frame(self.env.render())
        except Exception as exc:
            return NoFrame(f"render: {fault(exc)}")

    def rebuild(self) -> None:
        """Drop the environment (after a fault): the next command builds a new one."""
        self.close()

    def close(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            with contextlib.suppress(Exception):
                env.close()


def serve(connection: Any, spec: EnvSpec, path: list[str],
          environ: dict[str, str] | None = None) -> None:
    """A worker process's loop: `(command, argument, render)` in, `Answer` out. `path`: the
    evaluating process's sys.path, where the environment's modules are found; `environ`:
    its environment variables when the slot started (the fork server it comes from holds
    those of when it was started: `MUJOCO_GL` set since would otherwise be missed)."""
    import os
    import signal
    import sys

    # Ctrl-C and a SIGTERM to the whole job are the evaluating process's to act on: it ends
    # the evaluation between two steps and closes (or kills) this worker (R-EVAL-4).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.path[:] = [*path, *(p for p in sys.path if p not in path)]
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    host = EnvHost(spec)
    try:
        while True:
            try:
                command, argument, render = connection.recv()
            except (EOFError, OSError):  # the evaluating process is gone
                return
            if command == "close":
                return
            if command == "rebuild":
                host.rebuild()
                continue
            answer = host.run(command, argument, render)
            try:
                connection.send(answer)
            except Exception as exc:  # an answer that does not pickle: the episode's fault
                connection.send(("error", f"the environment's answer cannot be sent: "
                                          f"{fault(exc)}", answer[2]))
    finally:
        host.close()
