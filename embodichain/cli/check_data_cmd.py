"""`check-data`: decode every example a recipe trains on once, and list every bad one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from embodichain.cli import completion
from embodichain.cli.common import DEBUG_HELP, SET_HELP, error_console, reported_errors

SHOWN_EXAMPLES = 5  # example indices listed per problem


def check_data(
    config: Annotated[Path, typer.Argument(help="Recipe YAML file.",
                                           autocompletion=completion.recipe_files)],
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", help=SET_HELP, metavar="KEY=VALUE",
        autocompletion=completion.set_keys)] = None,
    workers: Annotated[int | None, typer.Option(
        "--workers", min=0, max=1024, metavar="N", help="Data worker processes that decode "
        "(default: the recipe's trainer.data_workers).")] = None,
    no_progress: Annotated[bool, typer.Option(
        "--no-progress", help="No progress bar.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Load every training example of a recipe once, as training would (only the features
    it selects), and report each bad one (the reader names episode, frame and file).
    Builds the factory's trainer in this process; trains nothing, writes nothing into the
    dataset or a run directory (only the per-user caches opening the data fills). Exit 0: every
    example loads; 1: some do not (listed); 2: bad input."""
    with reported_errors(debug):
        from embodichain.core.data.check_data import by_file_and_episode, check_examples
        from embodichain.core.data.dataset_source import DatasetSource
        from embodichain.core.distributed import process_group
        from embodichain.core.launch import api
        from embodichain.core.launch.train import build_trainer
        from embodichain.core.observe.work_progress import showing_progress
        from embodichain.core.recipe.machine_limits import refuse_or_warn

        recipe = api.load_recipe(config, overrides or [], warn=False)
        count = recipe.config.trainer.data_workers if workers is None else workers
        if workers is not None:  # the machine's limits hold for --workers as for the key
            changed = recipe.config.trainer.model_copy(update={"data_workers": workers})
            refuse_or_warn(recipe.config.model_copy(update={"trainer": changed}),
                           recipe.source, 1)
        console = error_console()
        with process_group.distributed_run(recipe.config.device) as device:
            with showing_progress(not no_progress):  # opening the data can be long
                trainer = build_trainer(recipe, device)
            try:
                source = trainer.source
                if not isinstance(source, DatasetSource):
                    console.print(f"{config}: the training data is in memory "
                                  f"({type(source).__name__}, {len(source)} examples): "
                                  "nothing to decode")
                    return
                report = _checked(check_examples, source.dataset, count, no_progress, console)
            finally:
                trainer.close()
        if not report.problems:
            console.print(f"{config}: all {report.checked} training examples load")
            return
        problems = by_file_and_episode(report.problems)  # one line per file and episode
        console.print(f"{config}: {report.failed} of {report.checked} training examples do "
                      f"not load ({len(problems)} distinct problem(s)):")
        for problem in problems:
            shown = ", ".join(str(i) for i in problem.examples[:SHOWN_EXAMPLES])
            more = len(problem.examples) - SHOWN_EXAMPLES
            console.print(f"  - {problem.message}\n    examples {shown}"
                          + (f" and {more} more" if more > 0 else ""), markup=False)
        raise typer.Exit(1)


def _checked(check, dataset, workers: int, no_progress: bool, console):  # noqa: ANN001, ANN202
    """`check(dataset, ...)` showing its progress (on stderr: examples, examples/s, the time
    left; plain lines off a terminal) unless `no_progress`."""
    if no_progress:
        return check(dataset, workers=workers)
    from embodichain.core.observe.work_progress import WorkProgress

    with WorkProgress("checking data", len(dataset), "examples", console=console) as bar:
        return check(dataset, workers=workers, progress=bar.advance)


def register(app: typer.Typer) -> None:
    app.command("check-data")(check_data)
