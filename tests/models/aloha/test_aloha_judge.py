"""The ALOHA judge's verdicts (R-ALOHA-2) from made-up steps, through `AlohaJudge`'s own
`step` and `outcomes`: the verdicts at gym-aloha's 300 steps are those of step 300, and an
episode the environment ended at its first success is no strict success."""

from __future__ import annotations

from embodichain_models.envs.aloha.judge import AlohaJudge
from embodichain_models.envs.aloha.tasks import MAX_REWARD


def judged(steps: int, done_at: set[int], terminated_at: int | None = None
           ) -> dict[str, bool]:
    """The outcomes of an episode of `steps` steps whose task is done (top reward) at the
    steps in `done_at`, ended by the environment (`terminated`) at `terminated_at`."""
    judge = AlohaJudge()
    for t in range(1, steps + 1):
        done = t in done_at
        judge.step({"task_done": done}, MAX_REWARD if done else 0.0, t == terminated_at,
                    False)
    return judge.outcomes()


def test_the_300_step_verdicts_are_those_of_step_300() -> None:
    """Catches the verdicts at 300 taken from a later step (`steps >= 300` instead of
    `== 300`): a cube held at step 300 and dropped at 301 is a strict success at 300 (not at
    400); one first lifted at step 350 is no success of any kind at 300."""
    held_to_300 = judged(400, set(range(250, 301)))
    assert held_to_300 == {"success": True, "strict_success": False,
                           "success_300": True, "strict_success_300": True}
    late = judged(400, set(range(350, 401)))
    assert late == {"success": True, "strict_success": True,
                    "success_300": False, "strict_success_300": False}


def test_an_episode_ended_at_its_first_success_is_no_strict_success() -> None:
    """Catches the `terminated` condition dropped: an environment that ends the episode at
    the first top reward (`terminate_on_success`) never shows whether the task stays done,
    so the strict verdict (at the limit, and at 300 when it ends there) is false while the
    field's is true. The same episode run on to its limit is a strict success."""
    assert judged(120, {120}, terminated_at=120)["strict_success"] is False
    at_300 = judged(300, {300}, terminated_at=300)
    assert at_300["success_300"] and not at_300["strict_success_300"]
    assert at_300["success"] and not at_300["strict_success"]
    run_on = judged(400, set(range(120, 401)))
    assert run_on["strict_success"] and run_on["strict_success_300"]
