"""`eval`: a checkpoint's policy judged in closed loop in its recipe's environment."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from embodichain.cli import completion
from embodichain.cli.common import DEBUG_HELP, env_rank, reported_errors
from embodichain.cli.launching import NoProgressOpt, NprocOpt, launch_if_asked


def evaluate(
    target: Annotated[Path, typer.Argument(
        metavar="RUN_DIR|CKPT|ARTIFACT", autocompletion=completion.any_path,
        help="Checkpoint file, a run directory for its newest snapshot, or a policy "
        "exported with `export --policy` (.onnx, .pt2).")],
    episodes: Annotated[int | None, typer.Option(
        "--episodes", metavar="N", help="Episodes (default: the recipe's evaluation.episodes).")
    ] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", metavar="S", help="Evaluation seed: episode e is reset with S + e (default: "
        "the recipe's evaluation.test_seed, else evaluation.seed); seeds overlapping the "
        "validation seeds are refused.")] = None,
    videos: Annotated[int | None, typer.Option(
        "--videos", metavar="K", help="Film the first K episodes (default: the recipe's "
        "evaluation.videos).")] = None,
    validation: Annotated[bool, typer.Option(
        "--validation", help="Judge the recipe's validation seeds (evaluation.seed), labelled "
        "so: to choose between ways of acting (--set) as validation would, before a test "
        "report.")] = False,
    changes: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE", autocompletion=completion.set_keys,
        help="Change the checkpoint's stored recipe, as long as its weights still fit, e.g. "
        "--set model.temporal_ensemble=0.01 (how a policy acts); recorded in summary.json "
        "(repeatable).")] = None,
    ema: Annotated[bool, typer.Option(
        "--ema", help="The EMA's weights act (default: the recipe's evaluation.acting).")
    ] = False,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="Where to write summary.json, episodes.jsonl and videos/ "
        "(default: RUN_DIR/evaluations/eval_update_U; must be new or empty).")] = None,
    nproc_per_node: NprocOpt = None,
    no_progress: NoProgressOpt = False,
    debug: Annotated[bool, typer.Option("--debug", help=DEBUG_HELP)] = False,
) -> None:
    """Run a checkpoint's policy (or an exported one) for the recipe's evaluation episodes,
    without training.

    The episodes are spread over the workers (one process, torchrun, or --nproc-per-node);
    the numbers are those of the validation at the checkpoint's update, on any world size.
    Only the checkpoint (or artifact) and the environment are needed: not the training data.
    """
    with reported_errors(debug):
        from embodichain.core.errors import UsageError
        from embodichain.core.evaluation.closed_loop import Overrides
        from embodichain.core.launch.self_launch import should_launch, worker_command

        overrides = Overrides(episodes, seed, videos, validation)
        changes = changes or []
        artifact = target.suffix in (".onnx", ".pt2")  # an exported policy (export --policy)
        if artifact and ema:
            raise UsageError(f"{target} is an exported policy: its weights are fixed (no --ema)")
        if artifact and changes:
            raise UsageError(f"{target} is an exported policy: its recipe is fixed in it (no "
                             "--set); export the checkpoint again with the change")
        if should_launch(nproc_per_node):  # bad input refused before any worker starts
            _check(target, artifact, out, overrides, ema, videos, changes)
        launch_if_asked(nproc_per_node, 0, lambda: worker_command(
            "eval", [("--episodes", episodes), ("--seed", seed), ("--videos", videos),
                     ("--validation", validation), ("--set", changes),
                     ("--ema", ema), ("--out", out), ("--no-progress", no_progress),
                     ("--debug", debug)], [str(target)]))
        with _progress(not no_progress and env_rank() == 0) as progress:
            if artifact:
                from embodichain.core.deploy.evaluate import evaluate_artifact

                found, result = evaluate_artifact(target, out=out, overrides=overrides,
                                                  progress=progress)
            else:
                from embodichain.core.launch.evaluate import evaluate_checkpoint

                found, result = evaluate_checkpoint(target, out=out, overrides=overrides,
                                                    ema=ema, progress=progress,
                                                    changes=changes)
        if result is not None:
            _print(found, result)


def _check(target: Path, artifact: bool, out: Path | None, overrides: Any, ema: bool,
           videos: int | None, changes: list[str]) -> None:
    """What the workers would refuse, refused once here before any starts (exit 2)."""
    if artifact:
        from embodichain.core.deploy.evaluate import check_artifact

        check_artifact(target, out, overrides)
    else:
        from embodichain.core.launch.evaluate import find_target

        found = find_target(target, out, overrides, ema, changes)
        if videos:  # where nothing renders: here, not by every worker
            _check_films(found.config["evaluation"])


def _check_films(section: dict[str, Any]) -> None:
    """`--videos K`: refuse (exit 2, naming MUJOCO_GL) an environment that cannot render."""
    from embodichain.core.evaluation.envs import EnvSpec
    from embodichain.core.evaluation.slots import check_renders
    from embodichain.core.evaluation.video import av_module
    from embodichain.core.recipe.evaluation_schema import EvaluationConfig

    config = EvaluationConfig.model_validate(section)
    av_module()
    check_renders(EnvSpec.of(config.env, render=True), config.vector, "--videos", "--videos 0")


class _progress:
    """A rich bar over the episodes on a terminal (rank 0), else nothing."""

    def __init__(self, wanted: bool) -> None:
        from rich.console import Console

        self.bar: Any = None
        if wanted and Console(stderr=True).is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress("episodes", BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True),
                                transient=True)
        self.task: Any = None

    def __enter__(self) -> Any:
        if self.bar is None:
            return None
        self.bar.start()

        def show(done: int, total: int) -> None:
            if self.task is None:
                self.task = self.bar.add_task("episodes", total=total)
            self.bar.update(self.task, completed=done)
        return show

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _print(found: Any, result: Any) -> None:
    from rich.markup import escape

    from embodichain.cli.tables import output_console, print_rows

    console = output_console()
    rows = [[str(r["episode"]), str(r["seed"]), "yes" if r["success"] else "no",
             f"{r['return']:.6g}", str(r["length"]), escape(r["failure"] or r["end"])]
            for r in result.records]
    print_rows(console, f"episodes of update {found.step}",
               ["episode", "seed", "success", "return", "length", "end"], rows)
    intervals = result.intervals()  # each success rate's Wilson 95% interval
    metrics = [[escape(k), f"{v:.6g}", "{:.3f}-{:.3f}".format(*intervals[k])
                if k in intervals else ""] for k, v in result.metrics().items()]
    print_rows(console, f"{found.checkpoint} (update {found.step})",
               ["metric", "value", "95% interval"], metrics)
    seeds = [r["seed"] for r in result.records]
    if seeds:
        console.print(f"seeds {min(seeds)}..{max(seeds)}: " + (
            "test seeds, which no validation touched" if result.seed_role == "test" else
            "the validation seeds, which selected the checkpoint (not a test figure: set "
            "evaluation.test_seed in the recipe, or pass --seed)"))
    console.print(f"wrote {escape(found.out)}: summary.json, episodes.jsonl"
                  + (f", videos/ ({len(result.films)} films)" if result.films else ""))


def register(app: typer.Typer) -> None:
    app.command("eval")(evaluate)
