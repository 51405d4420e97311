"""`export`: a checkpoint's model weights as a plain state_dict file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors, run_snapshot


def export(
    checkpoint: Annotated[Path, typer.Argument(
        help="Checkpoint file (.pt), or a run directory for the snapshot resume would use.")],
    out: Annotated[Path, typer.Argument(help="File to write, e.g. model.pt.")],
    ema: Annotated[bool, typer.Option(
        "--ema", help="Export the EMA weights (trainer.ema) instead of the model's own.")]
    = False,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT if it exists.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Write the model's state_dict, verified against the checkpoint's digest.

    Load it with `model.load_state_dict(torch.load(OUT, weights_only=True))`.
    """
    with reported_errors(debug):
        from embodichain.core.checkpoint.export import export_model

        data = None
        if checkpoint.is_dir():
            checkpoint, data = run_snapshot(checkpoint)
        done = export_model(checkpoint, out, ema=ema, force=force, data=data)
        what = "EMA weights" if done.ema else "model state_dict"
        typer.echo(f"wrote {done.path}: {what} of update {done.step} from {checkpoint} "
                   f"({done.tensors} tensors, {done.numbers:,} numbers). Load it with "
                   f"model.load_state_dict(torch.load({str(done.path)!r}, weights_only=True))")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
