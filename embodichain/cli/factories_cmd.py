"""`list-factories`: every registered recipe factory and whether it imports (R-PLUG-1)."""

from __future__ import annotations

from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, reported_errors


def list_factories(
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Show name, target, distribution, version and import status of each factory.

    A plugin that fails to import is listed as broken with the reason; that is not an error.
    """
    with reported_errors(debug):
        from rich.console import Console
        from rich.markup import escape

        from embodichain.cli.tables import print_rows
        from embodichain.core.recipe.discovery import (
            ENTRY_POINT_GROUP,
            check_factory,
            registered_factories,
        )
        from embodichain.core.recipe.packaged import registered_recipes

        infos = [check_factory(info) for info in registered_factories()]
        recipes = {recipe.name for recipe in registered_recipes()}
        console = Console()
        if not console.is_terminal:  # piped: whole names and targets, for grep and scripts
            console = Console(width=10_000)
        if not infos:
            console.print(f"No factories registered in entry-point group {ENTRY_POINT_GROUP}.")
            return
        headers = ("name", "target", "distribution", "version", "status",
                   "example recipe")  # `embodichain init NAME FILE`
        rows = [[escape(info.name), escape(info.target), escape(info.distribution or "-"),
                 escape(info.version or "-"),
                 "[green]ok[/]" if info.error is None else "[red]broken[/]",
                 f"init {escape(info.name)}" if info.name in recipes else "-"]
                for info in infos]
        print_rows(console, f"Recipe factories (entry-point group {ENTRY_POINT_GROUP})",
                   headers, rows)
        # The reasons go below the table: they are long, and a narrow column mangles them.
        for info in infos:
            if info.error is not None:
                console.print(f"[red]broken:[/] {escape(info.name)}: {escape(info.error)}",
                              soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("list-factories")(list_factories)
