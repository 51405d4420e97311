"""`embodichain eval`: a checkpoint's policy judged in closed loop, without training (R-EVAL-1).

Rank 0 reads the checkpoint (a run directory means its newest snapshot), its stored recipe
and what its factory derived from the data (`model_facts`); every rank builds the recipe's
trainer from its factory, rebuilt only to act (no data read, no sampler: the dataset may be
gone and the world size need not divide `trainer.global_batch_size`, R-EVAL-5), with the
checkpoint's weights (the EMA's with `--ema` or `evaluation.acting: ema`), as `--init-from`
loads them, and runs its share of the episodes; rank 0 writes `episodes.jsonl`,
`summary.json` and the films into the output directory. The evaluation is the one
validation runs, so the numbers are those of the validation at the checkpoint's update
(with the recipe's episodes and seed), on any world size.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.initial_weights import InitFrom, WeightsDoNotFit
from embodichain.core.distributed import process_group
from embodichain.core.errors import CheckpointError, UsageError
from embodichain.core.evaluation.admission import (
    check_overrides,
    refuse_demonstration_seeds,
    warn_unknown_seeds,
)
from embodichain.core.evaluation.closed_loop import Overrides
from embodichain.core.evaluation.records import EVALUATIONS, EvaluationResult, summary
from embodichain.core.evaluation.seed_ranges import judged_seeds
from embodichain.core.launch.train import build_trainer
from embodichain.core.observe.progress import configure_logging
from embodichain.core.recipe.evaluation_schema import EvaluationConfig
from embodichain.core.recipe.loading import (
    Recipe,
    apply_overrides,
    for_world_size,
    validate_recipe,
)
from embodichain.core.runs.elastic import without_derived_keys
from embodichain.core.training.evaluating import run_closed_loop
from embodichain.core.training.model_facts import (
    DEMONSTRATION_SEEDS_UNKNOWN,
    demonstration_seeds,
    rebuilding_to_act,
    run_record,
    unknown_seeds,
)


@dataclass(frozen=True)
class Target:
    """What rank 0 found: the checkpoint, its update, its recipe and the output directory."""

    checkpoint: str
    step: int
    config: dict[str, Any]
    out: str
    ema: bool
    model_facts: dict[str, Any] | None = None
    unknown_seeds: str | None = None
    """Why the demonstrations' seeds are unknown (the evaluation seeds went unchecked)."""
    recipe_changes: tuple[str, ...] = ()
    """`--set` items applied to the stored recipe (recorded in summary.json)."""


def find_target(target: Path, out: Path | None, overrides: Overrides, ema: bool,
                changes: Sequence[str] = ()) -> Target:
    """Rank 0: the checkpoint `target` names and its recipe (with the `--set` `changes`,
    which the weights must still fit: checked when they are loaded); refuses (UsageError,
    ConfigError) what cannot be evaluated, before anything is built or written."""
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.runs.snapshots import newest_snapshot

    check_overrides(overrides.episodes, overrides.videos)
    if target.is_dir():
        snapshot = newest_snapshot(target)
        if snapshot is None:
            raise UsageError(f"{target} is a directory without a snapshot; name a checkpoint "
                             "file or a run directory that saved one")
        path, run, step, directory = snapshot.path, snapshot.run, snapshot.step, target
    elif target.is_file():
        try:
            data = read_checkpoint(target)
        except CheckpointError as exc:
            raise UsageError(f"{target}: not a checkpoint that can be evaluated: {exc}") from None
        path, run = target, data["payload"].get("run") or {}
        step, directory = int(data["manifest"]["step"]), target.parent
    else:
        raise UsageError(f"{target}: no such checkpoint file or run directory")
    config = run.get("config")
    if not isinstance(config, dict):
        raise UsageError(f"{path} holds no recipe; it cannot be evaluated")
    if changes:  # e.g. how the policy acts: model.temporal_ensemble
        config = apply_overrides(config, changes)
        with rebuilding_to_act(run_record(run)):  # refused here, not by every rank
            validate_recipe(without_derived_keys(config), source=f"{path} (stored recipe, "
                            f"with --set {' --set '.join(changes)})")
    if not config.get("evaluation"):
        raise UsageError(f"the recipe of {path} has no evaluation section: nothing says which "
                         "environment to run (add one, docs/evaluation.md, and train again, "
                         "or resume with it: it is a resumable change)")
    judged, _ = judged_seeds(EvaluationConfig.model_validate(config["evaluation"]),
                             overrides, f"{path}")
    refuse_demonstration_seeds(judged.seed, judged.episodes, demonstration_seeds(run),
                               f"{path}")
    acting_ema = ema or config["evaluation"].get("acting") == "ema"
    if acting_ema and not (config.get("trainer") or {}).get("ema"):
        raise UsageError(f"--ema: the run of {path} keeps no EMA (trainer.ema); drop --ema")
    destination = out if out is not None else directory / EVALUATIONS / f"eval_update_{step:06d}"
    if destination.exists() and (not destination.is_dir() or any(destination.iterdir())):
        raise UsageError(f"--out {destination}: exists and is not an empty directory; name "
                         "another (nothing was overwritten)")
    return Target(str(path), step, without_derived_keys(config), str(destination), acting_ema,
                  run_record(run), unknown_seeds(run), tuple(changes))


def evaluate_checkpoint(target: Path, *, out: Path | None = None,
                        overrides: Overrides | None = None, ema: bool = False,
                        progress: Any = None, changes: Sequence[str] = ()
                        ) -> tuple[Target, EvaluationResult | None]:
    """Evaluate on every rank (inside torchrun or alone); rank 0 returns the result and has
    written it (None elsewhere). `changes`: `--set` items for the stored recipe."""
    asked = overrides or Overrides()
    configure_logging(process_group.env_rank())
    found = Target(**process_group.from_rank_zero_before_group(
        "eval/target", lambda: find_target(target, out, asked, ema, changes).__dict__))
    overrides, role = judged_seeds(EvaluationConfig.model_validate(
        found.config["evaluation"]), asked, found.checkpoint)  # the test seeds by default
    if process_group.env_rank() == 0:
        warn_unknown_seeds(overrides.seed, overrides.episodes, found.unknown_seeds,
                           found.checkpoint)
    # As one rank reads it: no data is sampled, so no world size is refused (R-EVAL-5).
    with rebuilding_to_act(found.model_facts):  # the recipe's data need not be there
        recipe: Recipe = for_world_size(validate_recipe(
            found.config, source=f"{found.checkpoint} (stored recipe)"), 1)
    with process_group.distributed_run(recipe.config.device) as device, \
            rebuilding_to_act(found.model_facts):
        trainer = _built(recipe, device, found)
        try:
            trainer.step = found.step
            result = run_closed_loop(trainer, ema=False, overrides=overrides,
                                     progress=progress, lockstep=True)
        finally:
            trainer.close()
        world_size = process_group.world_size()  # the group is gone after this block
    if result is not None:
        result.seed_role = role
        write_result(found, result, overrides, world_size)
    return found, result


def _built(recipe: Recipe, device: Any, found: Target) -> Any:
    """The recipe's trainer with the checkpoint's weights; with `--set` changes, weights
    that no longer fit are refused in eval's words (no --init-from was given)."""
    try:
        return build_trainer(recipe, device, init_from=InitFrom(Path(found.checkpoint),
                                                                ema=found.ema))
    except WeightsDoNotFit as exc:
        if not found.recipe_changes:
            raise
        fit = exc.found
        problems = [*fit.mismatched, *(f"{n}: not in {found.checkpoint}" for n in fit.missing),
                    *(f"{n}: in {found.checkpoint}, not in the model" for n in fit.unexpected)]
        raise UsageError(
            f"{found.checkpoint}: its weights do not fit the recipe as --set "
            f"{' --set '.join(found.recipe_changes)} changes it (a change of the model's "
            "shape needs another training, not an evaluation):\n"
            + "\n".join(f"  - {p}" for p in problems[:5])
            + (f"\n  ... and {len(problems) - 5} more" if len(problems) > 5 else "")
            + "\nNothing was evaluated.") from None


def write_result(found: Target, result: EvaluationResult, overrides: Overrides,
                 world_size: int) -> None:
    """Rank 0: episodes.jsonl, videos/ and summary.json into the output directory."""
    out = Path(found.out)
    out.mkdir(parents=True, exist_ok=True)
    result.write(out / "episodes.jsonl", out / "videos", out)
    evaluation = found.config["evaluation"]
    about = {"checkpoint": found.checkpoint, "step": found.step,
             "environment": evaluation["env"].get("id") or evaluation["env"].get("constructor"),
             "seed": overrides.seed if overrides.seed is not None else evaluation["seed"],
             "weights": "ema" if found.ema else "model",
             "world_size": world_size,
             **({"recipe_changes": list(found.recipe_changes)} if found.recipe_changes
                else {}),
             **({DEMONSTRATION_SEEDS_UNKNOWN: found.unknown_seeds} if found.unknown_seeds
                else {})}
    (out / "summary.json").write_text(json.dumps(summary(result, about), indent=2) + "\n")
