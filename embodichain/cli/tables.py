"""Tables that stay readable at any width: a rich table when its cells fit unbroken, else one
block per row (its first cell, then `column  value` lines; a value too long for that on a
line of its own), never a word folded mid-way."""

from __future__ import annotations

import os
from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def output_console() -> Console:
    """stdout's console: a terminal's width; piped, whole lines for grep and scripts unless
    `COLUMNS` says how wide (rich reads it), so that `COLUMNS=80 cmd | less` fits."""
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        console = Console(width=10_000)
    return console


def print_rows(console: Console, title: str, headers: Sequence[str],
               rows: Sequence[Sequence[str]]) -> None:
    """Print `rows` (cells in rich markup, already escaped) under `headers`."""
    table = Table(title=title)
    for header in headers:
        table.add_column(header, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    # Measured without the console's own limit (a measurement is clamped to it).
    natural = Measurement.get(console, console.options.update_width(10**6), table).maximum
    if natural <= console.width:
        console.print(table)
        return
    console.print(Text(title, style="italic"))
    width = max(len(h) for h in headers[1:])
    for row in rows:
        console.print()
        console.print(Text.from_markup(row[0], style="bold"), soft_wrap=True)
        for header, cell in zip(headers[1:], row[1:], strict=True):
            value = Text.from_markup(cell)
            label = f"  {header:<{width}}  "
            if len(label) + value.cell_len > console.width:  # a long name: a line of its own
                console.print(f"  {header}")
                # indented when it fits so, else from the first column (never folded)
                label = "    " if 4 + value.cell_len <= console.width else ""
            console.print(Text.assemble(label, value), soft_wrap=True)
