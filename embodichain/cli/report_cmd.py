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
        "--out", "-o", help="File to write, ending in .png or .html (default: report.png, or "
        "report.html with --format html, inside the first run directory).",
        dir_okay=False)] = None,
    fmt: Annotated[Format | None, typer.Option(
        "--format", help="png, or html: one page with the figure embedded and the runs' "
        "identities (default: from --out's suffix, else png).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace the output file if it exists.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Draw train/loss, every validation/* key and the learning rate, one line per run.

    Resume and roll-back points from run.json are marked; each run's time per update is
    drawn as stacked bars (data wait, forward and backward, optimizer step, the rest).
    Needs the `plot` extra.
    """
    with reported_errors(debug):
        from embodichain.core.observe.report import load_runs, render_html, render_png

        fmt, out = _destination(run_dirs, out, fmt, force)
        runs = load_runs(run_dirs)
        png = render_png(runs)
        out.parent.mkdir(parents=True, exist_ok=True)
        if fmt is Format.html:
            out.write_text(render_html(runs, png), encoding="utf-8")
        else:
            out.write_bytes(png)
        print(f"wrote {out} ({len(runs)} run(s))")


_SUFFIXES = {Format.png: (".png",), Format.html: (".html", ".htm")}


def _destination(run_dirs: list[Path], out: Path | None, fmt: Format | None, force: bool
                 ) -> tuple[Format, Path]:
    """The format and file to write; refuses a suffix that is not the format's, and an
    existing file unless `force` (nothing is overwritten silently)."""
    from embodichain.core.errors import UsageError

    if out is None:
        fmt = fmt or Format.png
        # Beside the run it shows, not in whatever the current directory happens to be.
        out = run_dirs[0] / f"report.{fmt.value}"
    else:
        by_suffix = next((f for f, suffixes in _SUFFIXES.items()
                          if out.suffix.lower() in suffixes), None)
        if fmt is None and by_suffix is None:
            raise UsageError(f"--out {out}: a report is a PNG image (.png) or an HTML page "
                             "(.html); name the file with one of these suffixes")
        fmt = fmt or by_suffix
        if by_suffix is not fmt:
            raise UsageError(f"--out {out}: --format {fmt.value} writes a {fmt.value.upper()} "
                             f"file; name it with {' or '.join(_SUFFIXES[fmt])}")
    if out.exists() and not force:
        raise UsageError(f"--out {out}: the file exists; nothing was written. Pass --force to "
                         "replace it, or --out to write another file")
    return fmt, out


def register(app: typer.Typer) -> None:
    app.command("report")(report)
