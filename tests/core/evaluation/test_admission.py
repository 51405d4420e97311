"""What is refused before an evaluation runs (R-EVAL-6): here, evaluation seeds among the
seeds the training data was recorded with."""

from __future__ import annotations

import pytest

from embodichain.core.errors import UsageError
from embodichain.core.evaluation.admission import refuse_demonstration_seeds


def test_every_evaluation_seed_up_to_the_last_is_checked_against_the_demonstrations() -> None:
    """Catches an off-by-one in the evaluated range (`seed .. seed + episodes - 2`): 3
    episodes from seed 7 run seeds 7, 8 and 9, so a demonstration recorded with seed 9 is
    refused, naming it; one recorded with seed 10 (or 6) is not."""
    with pytest.raises(UsageError, match=r"evaluation seeds 7\.\.9 include 1 seed\(s\) .*\(9\)"):
        refuse_demonstration_seeds(7, 3, [9, 30], "policy.onnx")
    refuse_demonstration_seeds(7, 3, [6, 10], "policy.onnx")
