"""`report`: curves of one or more runs as a PNG or a self-contained HTML page (R-OBS-1)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors


class Format(StrEnum):
    png = "png"
    html = "html"


def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories to compare.",
                                                   file_okay=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="File to write (default report.png, or report.html with "
        "--format html).", dir_okay=False)] = None,
    fmt: Annotated[Format | None, typer.Option(
        "--format", help="png, or html: one page with the figure embedded and the runs' "
        "identities (default: from --out's suffix, else png).")] = None,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Draw train/loss, every validation/* key and the learning rate, one line per run.

    Resume and roll-back points from run.json are marked. Needs the `plot` extra.
    """
    with reported_errors(debug):
        from embodichain.core.observe.report import load_runs, render_html, render_png

        if fmt is None:
            fmt = Format.html if out is not None and out.suffix.lower() in (".html", ".htm") \
                else Format.png
        out = out or Path(f"report.{fmt.value}")
        runs = load_runs(run_dirs)
        png = render_png(runs)
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt is Format.html:
            out.write_text(render_html(runs, png), encoding="utf-8")
        else:
            out.write_bytes(png)
        print(f"wrote {out} ({len(runs)} run(s))")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
