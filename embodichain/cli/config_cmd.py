"""`validate-config`: check a recipe without running or writing anything (R-CFG-5)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from embodichain.cli import completion
from embodichain.cli.common import DEBUG_HELP, SET_HELP, reported_errors


def validate_config(
    config: Annotated[Path, typer.Argument(help="Recipe YAML file.",
                                           autocompletion=completion.recipe_files)],
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help=SET_HELP, metavar="KEY=VALUE",
        autocompletion=completion.set_keys)] = None,
    build: Annotated[bool, typer.Option(
        "--build", help="Also build the factory's trainer in this process (imports torch and "
        "the factory; trains nothing, and writes only what opening its data writes into the "
        "per-user caches, never into the dataset or a run directory), to check what only "
        "the factory decides: "
        "its parameter groups, its data source, an evaluate for trainer.save_best.")] = False,
    nproc_per_node: Annotated[int | None, typer.Option(
        "--nproc-per-node", metavar="N", min=1, help="Check for N training processes on "
        "this machine, as `train-sl --nproc-per-node N` runs them: the machine's limits "
        "for N ranks, and that trainer.global_batch_size divides over them.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Validate a recipe: framework and factory schema, factory, data paths, and the sizes
    this machine can serve. Exit 0 or 2."""
    with reported_errors(debug):
        from embodichain.cli.common import print_recipe
        from embodichain.core.recipe.loading import known_world_size, load_recipe
        from embodichain.core.runs.run_dir import output_dir_problem

        # The factory stays unimported when its distribution registers a torch-free schema.
        recipe = load_recipe(config, overrides or [], import_factory=False)
        recipe, warnings = check_on_this_machine(recipe, nproc_per_node)
        if build:
            from embodichain.core.launch.train import check_by_building

            check_by_building(recipe)
        print_recipe(recipe.resolved)
        checked = "" if build else "; the trainer itself was not built: --build checks it too"
        typer.echo(f"{config}: valid (factory {recipe.config.factory}{checked})", err=True)
        # A warning, not an error: the recipe is valid; the directory may change before use.
        problem = output_dir_problem(Path(recipe.config.trainer.output_dir))
        if problem is not None:
            typer.echo(f"warning: {problem}", err=True)
        for warning in warnings:
            typer.echo(f"warning: {warning}", err=True)
        t = recipe.config.trainer
        if t.global_batch_size is not None and known_world_size(nproc_per_node) is None:
            typer.echo(f"note: trainer.global_batch_size {t.global_batch_size} was checked "
                       "against trainer.batch_size only (the world size is not known); "
                       "--nproc-per-node N checks it for N ranks", err=True)


def check_on_this_machine(recipe, nproc_per_node: int | None = None) -> tuple[Any, list[str]]:
    """What train-sl refuses before starting (exit 2) and warns about, on this machine with
    `nproc_per_node` ranks (default one; trainer.global_batch_size is checked against a
    world size only when it is known: N, or torchrun's); the trainer-built checks follow
    with --build. Returns the recipe as that world size runs it, and the warnings."""
    from embodichain.core.observe.loggers import check_loggers
    from embodichain.core.recipe.loading import for_world_size, known_world_size
    from embodichain.core.recipe.machine_limits import refuse_or_warn

    check_loggers(recipe.config.trainer.loggers)
    world_size = known_world_size(nproc_per_node)
    if world_size is not None:
        recipe = for_world_size(recipe, world_size)
    return recipe, [*recipe.warnings,
                    *refuse_or_warn(recipe.config, recipe.source, nproc_per_node or 1)]


def register(app: typer.Typer) -> None:
    app.command("validate-config")(validate_config)
