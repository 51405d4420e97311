"""What every command shares: error reporting with exit codes, and rank-aware printing."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from embodichain.core.errors import (
    EmbodichainError,
    Stopped,
    UsageError,
    peer_lost,
    refusal_in_chain,
)

SET_HELP = "Override a recipe value, e.g. --set optimizer.lr=0.01 (repeatable)."
DEBUG_HELP = "Show the full traceback on errors."


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def print_warnings(warnings: list[str] | tuple[str, ...]) -> None:
    """`warning: ...` on stderr, once per run: by rank 0, and not again by the workers a
    self-launching command started (it printed them before starting them)."""
    from embodichain.core.runs.commands import SELF_LAUNCHED

    if env_rank() != 0 or os.environ.get(SELF_LAUNCHED):
        return
    for warning in warnings:
        error_console().print(Text.assemble(("warning: ", "bold yellow"), warning))


def error_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def reported_errors(debug: bool = False) -> Iterator[None]:
    """Turn errors into one paragraph and an exit code (2 bad input, 1 failure; design §9).

    Under torchrun a usage error or a signal stop is printed by rank 0 alone (every rank
    reaches the same verdict); failures are printed by every rank, prefixed with its rank.
    Every non-zero exit under torchrun also leaves the message in the worker's elastic error
    file, so torchrun's failure summary shows it as the root cause.
    """
    try:
        yield
    except typer.Exit:
        raise
    except EmbodichainError as exc:
        if debug:
            traceback.print_exc()
        _report(exc, str(exc))
        raise typer.Exit(exc.exit_code) from None
    except BrokenPipeError:  # e.g. `embodichain runs --json | head`: the reader is gone
        quiet_stdout()
        raise typer.Exit(BROKEN_PIPE) from None
    except KeyboardInterrupt:
        rank = env_rank()
        message = "interrupted at once (a second Ctrl-C): no snapshot was written for the " \
                  "update in flight"
        # markup=False: rich would take "[rank 1]" for a style tag and drop it
        error_console().print(f"[rank {rank}] {message}" if rank else message, markup=False)
        record_error(message)
        raise typer.Exit(130) from None
    except Exception as exc:
        refusal = refusal_in_chain(exc)
        if refusal is not None:  # ours, re-raised wrapped by a factory: still a refusal
            if debug:
                traceback.print_exc()
            _report(refusal, wrapped_message(exc, refusal))
            raise typer.Exit(refusal.exit_code) from None
        rank = env_rank()
        prefix = f"[rank {rank}] " if rank else ""
        if debug:
            traceback.print_exc()
            hint = ""
        else:
            hint = " (run with --debug for the traceback)"
        # A peer's failure seen in a collective: one line that points at the peer, not
        # gloo's own words (the peer's message is the cause, and torchrun's root cause).
        message = peer_lost(exc) or f"{type(exc).__name__}: {exc}"
        print(f"{prefix}error: {message}{hint}", file=sys.stderr)
        record_error(message)
        raise typer.Exit(1) from None


def _report(exc: EmbodichainError, message: str) -> None:
    """Print `message` for our error `exc` (a refusal or stop by rank 0 only: every rank
    reaches the same verdict) and leave it in torchrun's error file."""
    rank = env_rank()
    if rank == 0 or not isinstance(exc, UsageError | Stopped):
        prefix = f"[rank {rank}] " if rank else ""
        error_console().print(Text.assemble(prefix, ("error: ", "bold red")
                                            if not isinstance(exc, Stopped) else "", message))
    record_error(message)


def wrapped_message(outer: BaseException, refusal: UsageError) -> str:
    """The refusal's own message, after the wrapper's words where they add any."""
    said, inner = str(outer).strip(), str(refusal)
    if not said or inner in said:
        return said or inner
    return f"{said}: {inner}"


# The exit code when stdout's reader went away (`runs --json | head -1`): 0, silently. Output
# that fits in the pipe's buffer is written before the reader goes, and ends with 0 anyway:
# any other code would depend on how fast `head` exits, not on what the command did.
BROKEN_PIPE = 0


def quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone, so that no later write or the
    interpreter's final flush raises BrokenPipeError again ("Exception ignored ...")."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def record_error(message: str) -> None:
    """Write `message` to torchrun's per-worker error file, if there is one.

    The format is torch elastic's (`{"message": {"message", "extraInfo": {"timestamp"}}}`),
    without a `py_callstack`, so torchrun's summary shows this one line as the root cause
    instead of `<N/A>`.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": message,
                        "extraInfo": {"timestamp": str(int(time.time()))}}}
    with contextlib.suppress(OSError):
        with open(path, "w") as f:
            json.dump(data, f)


def run_snapshot(directory: Path) -> tuple[Path, dict[str, Any]]:
    """The snapshot a run directory means, the one `resume` continues from: its path and
    verified content. Says on stderr why it is not last.pt; a directory without any is bad
    input."""
    from embodichain.core.checkpoint.names import snapshot_names
    from embodichain.core.runs.snapshots import newest_snapshot

    snapshot = newest_snapshot(directory)
    if snapshot is None:
        found = ", ".join(snapshot_names(directory)) or "none"
        raise UsageError(f"{directory} is a directory without a snapshot; name a checkpoint "
                         f"file (checkpoints there: {found})")
    if snapshot.note:
        error_console().print(f"note: {snapshot.note}")
    return snapshot.path, snapshot.data


def print_recipe(resolved: dict) -> None:
    """The resolved recipe as YAML on stdout (rank 0)."""
    import yaml
    from rich.console import Console
    from rich.syntax import Syntax

    text = yaml.safe_dump(resolved, sort_keys=False)
    if env_rank() == 0:
        Console().print(Syntax(text, "yaml", theme="ansi_dark", background_color="default"))
