"""Keys that need each other, and keys that cannot take effect (checked on a valid recipe).

A problem here is refused by every command that validates a recipe (exit 2), so
`validate-config` finds what `train-sl` would refuse; a warning names a key whose value
changes nothing in this recipe (it is never silently ignored). Torch-free.
"""

from __future__ import annotations

from embodichain.core.recipe.schema import FrameworkConfig

# The smallest weight `1 - decay` of an EMA step that float32 parameters can take: below
# it, `ema + w * (param - ema)` rounds back to `ema` and the average never moves.
EMA_SMALLEST_STEP = 2.0**-24


def recipe_problems(config: FrameworkConfig) -> list[str]:
    """What the recipe asks for that cannot work, each naming its key."""
    t = config.trainer
    problems = []
    if t.early_stop is not None and not t.validate_every:
        problems.append("trainer.early_stop: needs validations to count; set "
                        "trainer.validate_every (it is 0)")
    if t.save_best and not t.validate_every:
        problems.append("trainer.save_best: best.pt is written at a validation, and there is "
                        "none; set trainer.validate_every (it is 0)")
    if t.ema is not None and 1.0 - t.ema.decay < EMA_SMALLEST_STEP:
        problems.append(f"trainer.ema.decay: expected at most {1.0 - EMA_SMALLEST_STEP!r} "
                        f"(with 1 - decay below 2^-24 a float32 average never moves from "
                        f"the initial weights), got {t.ema.decay!r}")
    return problems


def recipe_warnings(config: FrameworkConfig) -> list[str]:
    """Keys whose value has no effect in this recipe, or whose effect never comes."""
    t = config.trainer
    found = []
    # Only a value the user chose: a stored (resolved) recipe holds the default too, and
    # resuming it must not warn about a key the user never set (issue 40).
    if t.data_workers == 0 and "prefetch" in t.model_fields_set \
            and t.prefetch != type(t).model_fields["prefetch"].default:
        found.append(f"trainer.prefetch: {t.prefetch} has no effect with trainer.data_workers "
                     "0 (batches are loaded in the training process)")
    if t.keep_last is not None and not t.save_every:
        found.append(f"trainer.keep_last: {t.keep_last} has no effect with trainer.save_every "
                     "0 (no step files are written, only last.pt)")
    needs = [k for k, on in (("trainer.save_best", t.save_best),
                             ("trainer.early_stop", t.early_stop is not None)) if on]
    # A short trial run (`--set trainer.max_updates=3`) that never validates is fine; a
    # best.pt or an early stop that never acts is said.
    if needs and t.validate_every > t.max_updates:
        found.append(f"trainer.validate_every: {t.validate_every} is beyond trainer."
                     f"max_updates {t.max_updates}: the run never validates, so "
                     f"{' and '.join(needs)} never {'act' if len(needs) > 1 else 'acts'}")
    elif t.early_stop is not None and t.validate_every \
            and t.early_stop.patience > t.max_updates // t.validate_every:
        found.append(f"trainer.early_stop.patience: {t.early_stop.patience} validations "
                     f"without improvement cannot happen in {t.max_updates // t.validate_every} "
                     "validations: the run never stops early")
    if t.ema is not None and 1.0 / (1.0 - t.ema.decay) > t.max_updates:
        found.append(f"trainer.ema.decay: {t.ema.decay} averages over about "
                     f"{1.0 / (1.0 - t.ema.decay):,.0f} updates, more than trainer.max_updates "
                     f"{t.max_updates}: the average stays close to the initial weights")
    scheduler = config.scheduler
    if scheduler is not None and scheduler.warmup_updates > t.max_updates:
        found.append(f"scheduler.warmup_updates: {scheduler.warmup_updates} is beyond "
                     f"trainer.max_updates {t.max_updates}: the learning rate never reaches "
                     "optimizer.lr")
    return found
