"""The `embodichain` command line. Commands import torch lazily, so `--help` is instant."""

from __future__ import annotations

from typing import Annotated

import typer

from embodichain.cli import (
    check_data_cmd,
    config_cmd,
    eval_cmd,
    examples,
    export_cmd,
    factories_cmd,
    init_cmd,
    inspect_cmd,
    report_cmd,
    reproduce_cmd,
    runs_cmd,
    train_cmd,
)

app = typer.Typer(
    name="embodichain",
    help="Supervised-learning training for PyTorch: recipes, torchrun, exact resume.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion
    # Plain click help: boolean flags shown as flags (rich mode prints `--json <bool>`), usage
    # errors as plain lines, and `--help` stays fast.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        import embodichain

        typer.echo(f"embodichain {embodichain.__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.",
                                          callback=_print_version, is_eager=True)] = False,
) -> None:
    """Supervised-learning training for PyTorch: recipes, torchrun, exact resume."""


train_cmd.register(app)
config_cmd.register(app)
check_data_cmd.register(app)
inspect_cmd.register(app)
export_cmd.register(app)
eval_cmd.register(app)
factories_cmd.register(app)
init_cmd.register(app)
report_cmd.register(app)
runs_cmd.register(app)
reproduce_cmd.register(app)


# Every command's help ends with examples (cli/examples.py).
for _info in app.registered_commands:
    _info.epilog = _info.epilog or examples.epilog(
        _info.name or _info.callback.__name__.replace("_", "-"))


def main() -> None:
    """Console-script entry point.

    Output still buffered when the command returns is flushed here, so that a reader that
    went away (`embodichain runs --json | head`) ends the command quietly (exit 0, see
    BROKEN_PIPE) instead of with "Exception ignored ... BrokenPipeError"; rich's tables end
    the same way. SIGPIPE itself stays ignored: a training run must never die because its
    stdout was closed.
    """
    import sys

    from rich.console import Console

    from embodichain.cli.common import BROKEN_PIPE, quiet_stdout
    from embodichain.core.distributed import launcher_watch, stop_request

    def reader_gone(console: Console) -> None:  # rich's own choice is exit 1
        quiet_stdout()
        raise SystemExit(BROKEN_PIPE)

    Console.on_broken_pipe = reader_gone  # type: ignore[method-assign]

    launcher_watch.watch_launcher()  # a worker stops with a snapshot if its launcher dies
    stop_request.sigterm_ignored_until_exit()  # this process ends with its run
    try:
        app()
    except SystemExit as exit_:
        code = exit_.code
        launcher_watch.exit_at_once_if_orphaned(code)  # R-PROC-1: its run saved, end now
    else:
        code = 0
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        quiet_stdout()
        code = BROKEN_PIPE
    launch = sys.modules.get("embodichain.core.launch.self_launch")
    if launch is not None and launch.ran_an_agent:
        # This process ran torch's elastic agent: its TCPStore thread can abort interpreter
        # teardown (torchrun itself ended with SIGABRT in 3 of about 60 SIGTERM stops in
        # benchmarks/stress_exit.py, R-PROC-2). Its workers have ended and the output is
        # flushed: nothing needs it.
        import os

        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)
    if "torch" in sys.modules:
        # Interpreter teardown would otherwise walk torch's and dynamo's object graphs to
        # collect them: about a second of CPU per process on a quiet machine (several on a
        # busy one), paid by every rank at the end of every run. What the run wrote is
        # closed by now; the memory goes back to the OS with the process.
        import gc

        gc.freeze()
    sys.exit(code)
