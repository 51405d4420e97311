"""`reproduce`: train a run again from its record and compare, bitwise."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli import completion
from embodichain.cli.common import DEBUG_HELP, reported_errors
from embodichain.cli.launching import NoProgressOpt


def reproduce(
    run_dir: Annotated[Path, typer.Argument(help="The run to train again and compare with.",
                                            autocompletion=completion.run_directories)],
    until: Annotated[int | None, typer.Option(
        "--until", metavar="N", help="Train and compare the first N updates only (the "
        "recipe's schedule still spans its trainer.max_updates).")] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", metavar="DIR", autocompletion=completion.any_path,
        help="The new run directory (must not exist). Default: RUN_DIR-reproduce-N, the "
        "first N free.")] = None,
    no_progress: NoProgressOpt = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Train a run's stored recipe again from scratch, into a new directory and on the run's
    number of workers, then compare it with the original update by update: every metric
    (but time/*) and every tensor of every snapshot both saved. Prints "bitwise identical
    through update N" (exit 0) or the first update, metric or tensor that differs (exit 1),
    and what differs in the recorded environment (versions, platform, device, dataset)."""
    with reported_errors(debug):
        from embodichain.core.launch import reproduce as core

        if core.is_worker():  # one of the workers started below
            assert output is not None and until is not None
            core.train_reproduction(run_dir, output, until, show_progress=not no_progress)
            return
        plan = core.prepare(run_dir, output, until)
        typer.echo(f"training {plan.run_dir}'s recipe again in {plan.output} "
                   f"({plan.world_size} worker{'s' if plan.world_size > 1 else ''}, "
                   f"updates 1-{plan.through})", err=True)
        if plan.world_size > 1:
            from embodichain.core.launch.self_launch import launch, worker_command

            code = launch(plan.world_size, 0, worker_command(
                "reproduce", [("--output", plan.output), ("--until", plan.through),
                              ("--no-progress", no_progress), ("--debug", debug)],
                [str(plan.run_dir)]))
            if code:
                typer.echo(f"error: the reproduction did not finish (exit {code}); nothing "
                           "was compared", err=True)
                raise typer.Exit(code)
        else:
            core.train_reproduction(plan.run_dir, plan.output, plan.through,
                                    show_progress=not no_progress)
        verdict = core.compare(plan)
        typer.echo("\n".join(verdict.lines))
        raise typer.Exit(verdict.exit_code)


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce)
