"""The `embodichain` command line. Commands import torch lazily, so `--help` is instant."""

from __future__ import annotations

from typing import Annotated

import typer

from embodichain.cli import (
    config_cmd,
    examples,
    factories_cmd,
    init_cmd,
    inspect_cmd,
    report_cmd,
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
inspect_cmd.register(app)
factories_cmd.register(app)
init_cmd.register(app)
report_cmd.register(app)
runs_cmd.register(app)


# Every command's help ends with examples (cli/examples.py).
for _info in app.registered_commands:
    _info.epilog = _info.epilog or examples.epilog(
        _info.name or _info.callback.__name__.replace("_", "-"))


def main() -> None:
    """Console-script entry point."""
    from embodichain.core.distributed import launcher_watch

    launcher_watch.watch_launcher()  # a worker stops with a snapshot if its launcher dies
    try:
        app()
    except SystemExit as exc:  # R-PROC-1: an orphaned worker, its run saved, ends at once
        launcher_watch.exit_at_once_if_orphaned(exc.code)
        raise
