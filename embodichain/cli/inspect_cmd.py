"""`inspect-checkpoint`: what a checkpoint holds, safely loaded and verified (R-INSP-1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors


def inspect_checkpoint(
    path: Annotated[Path, typer.Argument(help="Checkpoint file (.pt).", dir_okay=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Show a checkpoint's identity, model, optimizer and per-rank state."""
    with reported_errors(debug):
        from embodichain.core.checkpoint import read_checkpoint

        data = read_checkpoint(path)
        manifest = data["manifest"]
        if as_json:
            typer.echo(json.dumps(manifest))
        else:
            typer.echo(json.dumps(manifest, indent=2))


def register(app: typer.Typer) -> None:
    app.command("inspect-checkpoint")(inspect_checkpoint)
