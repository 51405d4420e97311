"""Which seeds `embodichain eval` judges, and what they are (R-TRUST-2).

A recipe's `evaluation.seed .. + episodes - 1` are its validation seeds: they select
`best.pt`, so a figure measured on them is not a test figure. `evaluation.test_seed`
(with `test_episodes`) names seeds no validation touches (the schema refuses an overlap).
`eval` judges, in order of preference: `--validation` (the validation seeds, to choose
between ways of acting as validation would), `--seed` (refused, exit 2, where it overlaps
the validation seeds), the test seeds, else the validation seeds themselves; the role is
labelled in summary.json (`seed_role`) and on the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from embodichain.core.errors import UsageError
from embodichain.core.recipe.evaluation_schema import EvaluationConfig

if TYPE_CHECKING:
    from embodichain.core.evaluation.closed_loop import Overrides

TEST, VALIDATION = "test", "validation"
"""`seed_role`: seeds no validation touched; the validation seeds that selected the
checkpoint (selection and report not separated)."""


@dataclass(frozen=True)
class SeedRange:
    """Seeds `first .. first + count - 1`."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def overlaps(self, other: SeedRange) -> bool:
        return self.first <= other.last and other.first <= self.last

    def __str__(self) -> str:
        return f"{self.first}..{self.last}"


def validation_seeds(config: EvaluationConfig) -> SeedRange:
    return SeedRange(config.seed, config.episodes)


def judged_seeds(config: EvaluationConfig, overrides: Overrides, what: str
                 ) -> tuple[Overrides, str]:
    """The overrides `eval` runs with (the seed and episodes filled in) and their role
    (`TEST` or `VALIDATION`); `--seed` overlapping the validation seeds is refused naming
    both ranges (UsageError, exit 2). `what`: the checkpoint or artifact, for the message."""
    validation = validation_seeds(config)
    if overrides.validation:
        if overrides.seed is not None:
            raise UsageError(f"{what}: --validation judges the validation seeds {validation}; "
                             f"--seed {overrides.seed} names others: give one of the two")
        return replace(overrides, seed=config.seed,
                       episodes=overrides.episodes or config.episodes), VALIDATION
    if overrides.seed is not None:
        episodes = overrides.episodes or (config.test_episodes if config.test_seed is not None
                                          else None) or config.episodes
        asked = SeedRange(overrides.seed, episodes)
        if asked.overlaps(validation):
            raise UsageError(
                f"{what}: --seed {overrides.seed} judges seeds {asked}, which overlap the "
                f"validation seeds {validation} (evaluation.seed, episodes) that selected "
                "the checkpoint: a figure from them is not a test figure. Choose seeds "
                f"outside them, e.g. --seed {max(validation.last + 1, 200_000)}, or omit "
                "--seed (the recipe's evaluation.test_seed, else its validation seeds)")
        return replace(overrides, episodes=episodes), TEST
    if config.test_seed is not None:
        return replace(overrides, seed=config.test_seed,
                       episodes=overrides.episodes or config.test_episodes
                       or config.episodes), TEST
    return replace(overrides, seed=config.seed,
                   episodes=overrides.episodes or config.episodes), VALIDATION
