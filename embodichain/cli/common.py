"""What every command shares: error reporting with exit codes, and rank-aware printing."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.text import Text

from embodichain.core.errors import EmbodichainError, UsageError

SET_HELP = "Override a recipe value, e.g. --set optimizer.lr=0.01 (repeatable)."
DEBUG_HELP = "Show the full traceback on errors."


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def error_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def reported_errors(debug: bool = False) -> Iterator[None]:
    """Turn errors into one paragraph and an exit code (2 bad input, 1 failure; SPEC §9).

    Under torchrun a usage error is printed by rank 0 alone (every rank reaches the same
    verdict); failures are printed by every rank, prefixed with its rank.
    """
    try:
        yield
    except typer.Exit:
        raise
    except EmbodichainError as exc:
        rank = env_rank()
        if debug:
            traceback.print_exc()
        if rank == 0 or not isinstance(exc, UsageError):
            prefix = f"[rank {rank}] " if rank else ""
            error_console().print(Text.assemble(prefix, ("error: ", "bold red"), str(exc)))
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        error_console().print("interrupted")
        raise typer.Exit(130) from None
    except Exception as exc:
        rank = env_rank()
        prefix = f"[rank {rank}] " if rank else ""
        if debug:
            traceback.print_exc()
            hint = ""
        else:
            hint = " (run with --debug for the traceback)"
        print(f"{prefix}error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        raise typer.Exit(1) from None
