"""`train-sl` (alias `train`) and `resume`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli.common import DEBUG_HELP, SET_HELP, env_rank, reported_errors

# No `dir_okay=False`: a directory gets the one-line `error: …` of every bad recipe path.
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Recipe YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP, metavar="KEY=VALUE")]
DebugOpt = Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)]
NoProgressOpt = Annotated[bool, typer.Option("--no-progress",
                                             help="No progress bar or periodic log lines.")]


def train_sl(
    config: ConfigOpt,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="CKPT|RUN_DIR|auto",
        help="Continue from a checkpoint (a run directory means its newest snapshot), into "
        "output_dir: a fresh one, or the checkpoint's own run directory. 'auto': start "
        "fresh when output_dir holds no run, else continue it (for --max-restarts and "
        "requeued jobs).")] = None,
    overrides: SetOpt = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the resolved recipe and exit.")] = False,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a recipe: one process, or every worker under torchrun."""
    with reported_errors(debug):
        from embodichain.core.recipe import load_recipe
        from embodichain.core.resume_policy import Start

        start = Start() if resume is None else _resume_start(resume)
        recipe = load_recipe(config, overrides or [])
        if print_config:
            print_recipe(recipe.resolved)
            return
        from embodichain.core.launch import train

        train(recipe, start=start, show_progress=not no_progress)


def _resume_start(resume: str):  # -> resume_policy.Start (imported lazily)
    from embodichain.core.errors import RefusedError, UsageError
    from embodichain.core.resume_policy import Start, newest_snapshot

    if resume == "auto":
        return Start("auto")
    path = Path(resume)
    if path.is_dir():
        snapshot = newest_snapshot(path)
        if snapshot is None:
            raise RefusedError(f"--resume {resume}: the run directory holds no snapshot yet")
        return Start("checkpoint", checkpoint=snapshot.path)
    if not path.exists():
        raise UsageError(f"--resume {resume}: no such checkpoint file or run directory "
                         "(or 'auto')")
    return Start("checkpoint", checkpoint=path)


def resume_run(
    run_dir: Annotated[Path, typer.Argument(help="Run directory to continue in place.")],
    overrides: SetOpt = None,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Continue a run in place from its newest complete snapshot, with the recipe it stores.

    Metrics recorded after that snapshot are moved to a side file (a recorded roll-back), so
    the continued history is exactly the uninterrupted one. A finished run is left as it is.
    """
    with reported_errors(debug):
        from embodichain.core.errors import RefusedError
        from embodichain.core.launch import train
        from embodichain.core.recipe import validate_recipe
        from embodichain.core.resume_policy import Start, newest_snapshot
        from embodichain.core.run_dir import RUN_JSON, read_run_json

        if not run_dir.is_dir():
            raise RefusedError(f"{run_dir} is not a run directory"
                               + (" (it is a file)" if run_dir.exists() else
                                  " (no such directory)"))
        snapshot = newest_snapshot(run_dir)
        if snapshot is not None:
            raw, source = snapshot.run["config"], f"{snapshot.path} (stored recipe)"
        else:  # the run never saved: it restarts from update 0 with its recorded recipe
            stored = read_run_json(run_dir)
            if stored is None or not isinstance(stored.get("config"), dict):
                raise RefusedError(f"{run_dir} holds no snapshot and no {RUN_JSON} with a "
                                   "recipe; it is not a run that can be continued")
            raw, source = stored["config"], f"{run_dir / RUN_JSON} (stored recipe)"
        raw["trainer"]["output_dir"] = str(run_dir)  # wherever the directory lives now
        recipe = validate_recipe(raw, source=source, overrides=overrides or [])
        train(recipe, start=Start("in_place", snapshot=snapshot),
              show_progress=not no_progress)


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
