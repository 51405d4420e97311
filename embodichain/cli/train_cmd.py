"""`train-sl` (alias `train`) and `resume`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from embodichain.cli import completion
from embodichain.cli.common import (
    DEBUG_HELP,
    SET_HELP,
    print_recipe,
    print_warnings,
    reported_errors,
)
from embodichain.cli.launching import (
    MaxRestartsOpt,
    NoProgressOpt,
    NprocOpt,
    launch_if_asked,
    local_ranks,
)

if TYPE_CHECKING:  # torch is imported only when training starts
    from embodichain.core.checkpoint.initial_weights import InitFrom

# No `dir_okay=False`: a directory gets the one-line `error: …` of every bad recipe path.
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="Recipe YAML file.",
                                         autocompletion=completion.recipe_files)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP, metavar="KEY=VALUE",
                                                  autocompletion=completion.set_keys)]
DebugOpt = Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)]
def train_sl(
    config: ConfigOpt,
    resume: Annotated[str | None, typer.Option(
        "--resume", metavar="CKPT|RUN_DIR|auto", autocompletion=completion.any_path,
        help="Continue from a checkpoint (a run directory means its newest snapshot), into "
        "output_dir: a fresh one, or the checkpoint's own run directory. 'auto': start "
        "fresh when output_dir holds no run, else continue it (for --max-restarts and "
        "requeued jobs).")] = None,
    overrides: SetOpt = None,
    init_from: Annotated[Path | None, typer.Option(
        "--init-from", metavar="CKPT", autocompletion=completion.any_path,
        help="Start a new run (its own identity, optimizer and schedule) from the model "
        "weights of a checkpoint (sharded or not) or of a state_dict written by `embodichain "
        "export`, matched by name. Not with --resume.")] = None,
    init_from_ema: Annotated[bool, typer.Option(
        "--init-from-ema", help="With --init-from: the checkpoint's EMA weights instead.")
    ] = False,
    init_allow_missing: Annotated[bool, typer.Option(
        "--init-allow-missing", help="With --init-from: model tensors the file lacks keep "
        "their own initialisation (e.g. a new head).")] = False,
    init_allow_unexpected: Annotated[bool, typer.Option(
        "--init-allow-unexpected", help="With --init-from: tensors of the file the model "
        "lacks are dropped.")] = False,
    init_skip: Annotated[list[str] | None, typer.Option(
        "--init-skip", metavar="REGEX", help="With --init-from: model tensors whose name "
        "matches REGEX (searched; repeatable) keep their own initialisation, e.g. a resized "
        "head: --init-skip '^head\\.'.")] = None,
    print_config: Annotated[bool, typer.Option(
        "--print-config", help="Print the resolved recipe and exit.")] = False,
    nproc_per_node: NprocOpt = None,
    max_restarts: MaxRestartsOpt = 0,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Train a recipe: one process, or every worker under torchrun."""
    with reported_errors(debug), _suggestions_keep(overrides):
        from embodichain.core.errors import UsageError
        from embodichain.core.launch import api
        from embodichain.core.launch.self_launch import should_launch, worker_command

        init = _init_from(init_from, init_from_ema, init_allow_missing, init_allow_unexpected,
                          resume, init_skip or [])
        # The public API's path (R-API-1): what this machine cannot serve is refused before
        # any worker starts (exit 2); warnings are shown once.
        recipe = api.load_recipe(config, overrides or [],
                                 local_ranks=local_ranks(nproc_per_node), warn=False)
        print_warnings(recipe.warnings)
        if init_from is not None and not init_from.is_file() and (
                print_config or should_launch(nproc_per_node)) and not _continues(
                    resume, recipe.config.trainer.output_dir):  # before any worker starts
            raise UsageError(f"--init-from {init_from}: no such checkpoint or state_dict file")
        if print_config:
            if resume not in (None, "auto") and not Path(resume).exists():
                raise UsageError(f"--resume {resume}: no such checkpoint file or run directory")
            print_recipe(recipe.resolved)
            return
        launch_if_asked(nproc_per_node, max_restarts, lambda: worker_command(
            "train-sl", [("--config", config), ("--resume", resume), ("--set", overrides or []),
                         ("--init-from", init_from), ("--init-from-ema", init_from_ema),
                         ("--init-allow-missing", init_allow_missing),
                         ("--init-allow-unexpected", init_allow_unexpected),
                         ("--init-skip", init_skip or []),
                         ("--no-progress", no_progress), ("--debug", debug)]))
        # Only rank 0 looks at the checkpoint: other nodes need not have it (R-DIST-6).
        api.train(recipe, resume=resume, show_progress=not no_progress, init_from=init)


def _init_from(path: Path | None, ema: bool, allow_missing: bool, allow_unexpected: bool,
               resume: str | None, skip: list[str]) -> InitFrom | None:
    """The `InitFrom` the --init-* options ask for (None without --init-from); refuses
    (exit 2) --init-from with --resume (but `--resume auto`: the weights start the run, a
    restart continues its snapshots), and --init-* options without --init-from."""
    from embodichain.core.errors import UsageError

    if path is None:
        given = [name for name, on in (("--init-from-ema", ema),
                                       ("--init-allow-missing", allow_missing),
                                       ("--init-allow-unexpected", allow_unexpected),
                                       ("--init-skip", bool(skip))) if on]
        if given:
            raise UsageError(f"{', '.join(given)} needs --init-from CKPT")
        return None
    if resume not in (None, "auto"):
        raise UsageError(f"--init-from {path} and --resume {resume} exclude each other: "
                         "--resume continues a run exactly, --init-from starts a new one "
                         "from its weights; give only one (--resume auto with --init-from: "
                         "the weights start the run, a restart continues its snapshots)")
    from embodichain.core.checkpoint.initial_weights import InitFrom

    return InitFrom(path, ema, allow_missing, allow_unexpected, tuple(skip))


def _continues(resume: str | None, output_dir: str) -> bool:
    """Whether `--resume auto` will continue a run in `output_dir` (so reads no
    `--init-from` weights: they start a run, a restart or requeue continues it)."""
    from embodichain.core.runs.run_dir import RUN_JSON

    return resume == "auto" and (Path(output_dir) / RUN_JSON).is_file()


def resume_run(
    run_dir: Annotated[Path, typer.Argument(help="Run directory to continue in place.",
                                            autocompletion=completion.run_directories)],
    overrides: SetOpt = None,
    nproc_per_node: NprocOpt = None,
    max_restarts: MaxRestartsOpt = 0,
    no_progress: NoProgressOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Continue a run in place from its newest complete snapshot, with the recipe it stores.

    Metrics recorded after that snapshot are moved to a side file (a recorded roll-back), so
    the continued history is exactly the uninterrupted one. A finished run is left as it is.
    """
    with reported_errors(debug), _suggestions_keep(overrides):
        from embodichain.core.distributed import process_group
        from embodichain.core.launch import api
        from embodichain.core.launch.self_launch import should_launch, worker_command
        from embodichain.core.launch.train import train
        from embodichain.core.runs.resume_policy import Start
        from embodichain.core.runs.run_lock import refuse_if_locked
        from embodichain.core.runs.snapshots import stored_recipe

        if should_launch(nproc_per_node):
            refuse_if_locked(run_dir)  # a live run's directory: named before any worker starts
            stored = stored_recipe(run_dir)  # a bad RUN_DIR is refused before any worker starts
            # ... and so are bad --set values and sizes this machine cannot serve for the N
            # workers (each worker would refuse them only after the launch).
            api.load_recipe({**stored.config, "trainer": {**stored.config["trainer"],
                                                          "output_dir": str(run_dir)}},
                            overrides or [], source=stored.source, warn=False,
                            local_ranks=nproc_per_node)
        launch_if_asked(nproc_per_node, max_restarts, lambda: worker_command(
            "resume", [("--set", overrides or []), ("--no-progress", no_progress),
                       ("--debug", debug)], [str(run_dir)]))
        found = None

        def read() -> list:  # on rank 0 only
            nonlocal found
            refuse_if_locked(run_dir)  # a live run is named (host, pid, since), R-RUN-5
            found = stored_recipe(run_dir)
            return [found.config, found.source]

        # Rank 0 reads the run directory and tells the others its recipe (R-DIST-6).
        raw, source = process_group.from_rank_zero_before_group("resume/recipe", read)
        raw["trainer"]["output_dir"] = str(run_dir)  # wherever the directory lives now
        recipe = api.load_recipe(raw, overrides or [], source=source, warn=False,
                                 local_ranks=local_ranks(nproc_per_node))
        print_warnings(recipe.warnings)
        train(recipe, start=Start("in_place", snapshot=found.snapshot if found else None),
              show_progress=not no_progress)


@contextlib.contextmanager
def _suggestions_keep(overrides: list[str] | None) -> Iterator[None]:
    """Every command a message of this one suggests keeps the user's `--set` options."""
    from embodichain.core.runs.commands import keep_user_overrides

    with keep_user_overrides(overrides or []):
        yield


def register(app: typer.Typer) -> None:
    app.command("train-sl")(train_sl)
    app.command("train", help="Alias of train-sl.")(train_sl)
    app.command("resume")(resume_run)
