"""A factory's EpisodeJudge (R-EVAL-1): outcomes judged from every step of each episode,
kept in its record and averaged into `validation/<name>_rate`, in process on the pure-Python
`Reach` environment (tests/factories/closed_loop.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation
from embodichain.core.recipe.evaluation_schema import EvaluationConfig
from tests.support.processes import REPO


class StepCounter:
    """Judges an episode by its steps: `three` (exactly 3 of them), `moved` (at least one)
    and `success` (it ran to the limit rather than reaching the target: the opposite
    of the environment's)."""

    def __init__(self) -> None:
        self.steps, self.terminated = 0, False

    def step(self, info: Mapping[str, Any], reward: float, terminated: bool,
             truncated: bool) -> None:
        self.steps += 1
        self.terminated = terminated

    def outcomes(self) -> dict[str, bool]:
        return {"three": self.steps == 3, "moved": self.steps > 0,
                "success": not self.terminated}


class Proportional:
    def reset(self, env_index: int) -> None:
        pass

    def act(self, observations: Any) -> np.ndarray:
        return np.clip(-1.5 * np.asarray(observations), -1.0, 1.0).astype(np.float32)


def test_a_judge_adds_outcomes_per_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a judge shared between episodes or slots (its step count would run on), its
    `success` not replacing the predicate's, outcomes summed instead of averaged, and a
    faulted episode (seed 102 raises at step 3) keeping its judge's verdicts."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "factories"))
    config = EvaluationConfig.model_validate({
        "env": {"constructor": "closed_loop:make_reach", "kwargs": {"raise_at": 102}},
        "episodes": 6, "seed": 100, "max_steps": 4, "envs_per_rank": 2})
    evaluation = ClosedLoopEvaluation(config, lambda model, device: Proportional(),
                                      judge=StepCounter)
    result = evaluation.run(None, "cpu", lockstep=False)
    assert result is not None
    records = result.records
    ends = [r["end"] for r in records]
    assert "terminated" in ends and "max_steps" in ends  # both verdicts occur
    for r in records:
        if r["failure"] is not None:  # after 2 steps: its judge would say it moved
            assert r["outcomes"] == {"three": False, "moved": False} and not r["success"]
        else:
            assert r["outcomes"] == {"three": r["length"] == 3, "moved": True}
            assert r["success"] == (r["end"] != "terminated")
    assert records[2]["failure"] is not None and records[2]["length"] == 2
    metrics = result.metrics()
    assert metrics["validation/three_rate"] == sum(r["outcomes"]["three"] for r in records) / 6
    assert sum(r["outcomes"]["three"] for r in records) == 1  # lengths 4 4 2 4 4 3
    assert metrics["validation/moved_rate"] == 5 / 6
    assert metrics["validation/success_rate"] == sum(r["success"] for r in records) / 6
