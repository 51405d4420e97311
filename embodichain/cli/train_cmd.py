"""`train-sl` (alias `train`) and `resume`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, SET_HELP, env_rank, reported_errors

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Recipe YAML file.",
                                         dir_okay=False)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP, metavar="KEY=VALUE")]
DebugOpt = Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress",
                                             help="No progress bar or periodic log lines.")]


def train_sl(
    config: ConfigOpt,
    resume: Annotated[Path | None, typer.Option(
        "--resume", help="Continue from this checkpoint (into output_dir: fresh, or the "
        "checkpoint's own run directory).", dir_okay=False)] = None,
    overrides: SetOpt = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the resolved recipe and exit.")] = False,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a recipe: one process, or every worker under torchrun."""
    with reported_errors(debug):
        from embodichain.core.recipe import load_recipe

        recipe = load_recipe(config, overrides or [])
        if print_config:
            print_recipe(recipe.resolved)
            return
        from embodichain.core.launch import train

        train(recipe, resume=resume, show_progress=not no_progress)


def resume_run(
    run_dir: Annotated[Path, typer.Argument(help="Run directory holding last.pt.",
                                            file_okay=False)],
    overrides: SetOpt = None,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Continue an interrupted run in place from its last.pt, with the recipe it stores."""
    with reported_errors(debug):
        from embodichain.core.checkpoint import LAST, read_checkpoint
        from embodichain.core.errors import RefusedError
        from embodichain.core.launch import train
        from embodichain.core.recipe import validate_recipe

        checkpoint = run_dir / LAST
        if not checkpoint.is_file():
            raise RefusedError(f"{run_dir} has no {LAST} to resume from"
                               + ("" if run_dir.is_dir() else " (no such directory)"))
        data = read_checkpoint(checkpoint)
        raw = data["payload"]["run"]["config"]
        raw["trainer"]["output_dir"] = str(run_dir)  # wherever the directory lives now
        recipe = validate_recipe(raw, source=f"{checkpoint} (stored recipe)",
                                 overrides=overrides or [])
        train(recipe, resume=checkpoint, checkpoint=data, show_progress=not no_progress)


def print_recipe(resolved: dict) -> None:
    import yaml
    from rich.console import Console
    from rich.syntax import Syntax

    text = yaml.safe_dump(resolved, sort_keys=False)
    if env_rank() == 0:
        Console().print(Syntax(text, "yaml", theme="ansi_dark", background_color="default"))


def register(app: typer.Typer) -> None:
    app.command("train-sl")(train_sl)
    app.command("train", help="Alias of train-sl.")(train_sl)
    app.command("resume")(resume_run)
