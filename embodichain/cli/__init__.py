"""The `embodichain` command line. Commands import torch lazily, so `--help` is instant."""

from __future__ import annotations

import typer

from embodichain.cli import (
    config_cmd,
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
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
train_cmd.register(app)
config_cmd.register(app)
inspect_cmd.register(app)
factories_cmd.register(app)
init_cmd.register(app)
report_cmd.register(app)
runs_cmd.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
