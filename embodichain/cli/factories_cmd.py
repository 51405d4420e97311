"""`list-factories`: every registered recipe factory and whether it imports."""

from __future__ import annotations

from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors


def list_factories(
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Show name, target, distribution, version and import status of each factory."""
    with reported_errors(debug):
        from rich.console import Console
        from rich.table import Table

        from embodichain.plugins.discovery import (
            ENTRY_POINT_GROUP,
            check_factory,
            registered_factories,
        )

        table = Table(title=f"Recipe factories (entry-point group {ENTRY_POINT_GROUP})")
        for column in ("name", "target", "distribution", "version", "status"):
            table.add_column(column)
        for info in map(check_factory, registered_factories()):
            status = "[green]ok[/]" if info.error is None else f"[red]broken:[/] {info.error}"
            table.add_row(info.name, info.target, info.distribution or "-",
                          info.version or "-", status)
        Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("list-factories")(list_factories)
