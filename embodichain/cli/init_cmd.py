"""`init`: write an editable copy of a packaged example recipe (like torchtune's `tune cp`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli import completion
from embodichain.cli.common import DEBUG_HELP, reported_errors


def init_recipe(
    name: Annotated[str, typer.Argument(help="Packaged recipe, e.g. sl_ddp or nerd "
                                        "(list-factories shows which exist).",
                                        autocompletion=completion.recipe_names)],
    destination: Annotated[Path, typer.Argument(help="YAML file to write; never overwritten.",
                                                dir_okay=False,
                                                autocompletion=completion.recipe_files)],
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Write an editable copy of a packaged example recipe, with comments."""
    with reported_errors(debug):
        import embodichain
        from embodichain.core.recipe.packaged import write_recipe_copy

        path = shlex.quote(str(destination))
        header = (
            f"# Written by `embodichain init {name}` (embodichain {embodichain.__version__}). "
            "Edit freely, then\n"
            f"#   embodichain validate-config {path}\n"
            f"#   embodichain train-sl --config {path}\n"
            "#   OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node=2 -m embodichain "
            f"train-sl --config {path}\n"
        )
        write_recipe_copy(name, destination, header)
        print(f"wrote {destination} (recipe {name}); check it with "
              f"`embodichain validate-config {path}`, train with "
              f"`embodichain train-sl --config {path}`")


def register(app: typer.Typer) -> None:
    app.command("init")(init_recipe)
