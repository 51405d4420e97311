"""The ALOHA evaluation's two verdicts, each at two episode limits (R-ALOHA-2).

The field's verdict (ACT's and gym-aloha's `is_success`) is the top reward reached at some
step; it counts a transfer whose left finger touches the cube once and then lets it fall.
The strict one (R-TRUST-1) is a subset of it: the field's verdict reached AND the top
reward's own condition still holding at the episode's last step (the cube held off the
table by the left finger; the peg touching the pin), AND the environment's
`info["task_done"]` there when it gives one (a rule may only tighten, never loosen, the
reward's), AND the episode ran to its limit rather than ending at the first success. Each
is judged at the recipe's limit (`max_steps`: 400, ACT's and lerobot's) and at step 300
(gym-aloha registers its tasks with `max_episode_steps=300`). The strict verdicts need the
environment not to end the episode at success (`terminate_on_success: false`, as the
example recipes set).

Outcomes (metrics `validation/<name>_rate`): `success` (the field's at the limit: the
record's success and `validation/success_rate`), `strict_success`, `success_300`,
`strict_success_300`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from embodichain_models.envs.aloha.tasks import MAX_REWARD

GYM_ALOHA_STEPS = 300
"""gym-aloha's registered episode limit."""


class AlohaJudge:
    """One episode's verdicts (an `EpisodeJudge`): `step(...)` after every step."""

    def __init__(self, also_at: int = GYM_ALOHA_STEPS) -> None:
        self.also_at = also_at
        self.steps = 0
        self.reached = False  # the top reward at some step so far
        self.done = False  # the task done at the latest step
        self.terminated = False
        self.at: tuple[bool, bool] | None = None  # (reached, done) at step `also_at`

    def step(self, info: Mapping[str, Any], reward: float, terminated: bool,
             truncated: bool) -> None:
        self.steps += 1
        top = reward >= MAX_REWARD
        self.reached = self.reached or top
        # The reward's condition at this step, tightened (never loosened) by the env's own.
        self.done = top and bool(info.get("task_done", True))
        self.terminated = terminated
        if self.steps == self.also_at:
            self.at = (self.reached, self.reached and self.done and not terminated)

    def outcomes(self) -> dict[str, bool]:
        late = self.at if self.at is not None else (self.reached, False)
        strict = self.reached and self.done and not self.terminated
        return {"success": self.reached, "strict_success": strict,
                f"success_{self.also_at}": late[0],
                f"strict_success_{self.also_at}": late[1]}
