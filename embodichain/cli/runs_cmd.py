"""`runs`: the run directories below a directory, with their state (running from the lock)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors


def runs(
    root: Annotated[Path, typer.Argument(help="Directory to search for runs.",
                                         file_okay=False)] = Path("outputs"),
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document for scripts.")]
    = False,
    json_lines: Annotated[bool, typer.Option(
        "--json-lines", help="One JSON object per run and line, for pipes (`| head -1`, "
        "`| jq -c`).")] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """List runs: id, factory, world size, state, newest snapshot, each run's best metric."""
    with reported_errors(debug):
        from rich.markup import escape

        from embodichain.cli.tables import output_console, print_rows
        from embodichain.core.errors import UsageError
        from embodichain.core.runs.table import describe_run, find_runs

        if not root.is_dir():
            raise UsageError(f"{root} is not a directory; name the directory that holds your "
                             "runs, e.g. `embodichain runs outputs`")
        rows = [describe_run(directory) for directory in find_runs(root)]
        if as_json:
            print(json.dumps([row.as_json() for row in rows], indent=2))
            return
        if json_lines:
            for row in rows:
                print(json.dumps(row.as_json()), flush=True)
            return
        console = output_console()  # piped: whole lines unless COLUMNS
        if not rows:
            console.print(f"No runs below {escape(str(root))} (no run.json found).")
            return
        headers = ("directory", "run id", "factory", "world", "state", "snapshot",
                   "best metric", "modified")
        cells = []
        for row in rows:
            color = {"running": "cyan", "finished": "green",
                     "stopped_early": "green",
                     "interrupted": "red"}.get(row.state, "yellow")
            # each run its own metric (R-MET-1), its best value as the summary shows it
            metric = (f"{row.metric} {row.metric_best:.4g} (best, update "
                      f"{row.metric_best_step})" if row.metric_best is not None
                      else f"{row.metric} -")
            cells.append([escape(row.directory), escape((row.run_id or "-")[:12]),
                          escape(row.factory or "-"), str(row.world_size or "-"),
                          f"[{color}]{escape(row.state_text)}[/]",
                          str(row.snapshot_step) if row.snapshot_step is not None else "-",
                          escape(metric), row.modified])
        print_rows(console, f"Runs below {escape(str(root))}", headers, cells)


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
