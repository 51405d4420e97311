"""The two ALOHA verdicts (R-ALOHA-2, embodichain-models[sim]): demonstrations that finish
the task, `prepare` keeping only those, and an evaluation that reports the field's verdict
(the top reward reached) beside the strict one (the task still done at the last step),
each at the recipe's limit and at gym-aloha's 300 steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from embodichain_models.data.aloha import expert as experts
from embodichain_models.data.aloha.prepare import INFO_FILE, prepare
from embodichain_models.data.aloha.record import Recorder
from embodichain_models.data.lerobot.dataset import LeRobotFrames
from embodichain_models.envs.aloha.judge import AlohaJudge
from embodichain_models.envs.aloha.tasks import EVAL_SEED, TASKS

from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation
from embodichain.core.recipe.evaluation_schema import EvaluationConfig

HELD = 0.1  # a cube above this height (m) is off the table (it rests at 0.02)


def _act_handover(left, right, objects):
    """ACT's own transfer-cube plan, the left arm not waiting for the cube: in the
    joint-space scene its finger touches the cube once (the first top reward) and the cube
    falls."""
    plan = experts.transfer_cube(left, right, objects)
    plan.left = [w for w in plan.left if w.t != experts.HANDOVER_STEP]
    return plan


def _opens_right_early(left, right, objects):
    """The right gripper lets the cube go before the hand-over: no top reward at all."""
    from dataclasses import replace

    plan = experts.transfer_cube(left, right, objects)
    plan.right = [w if w.t < 200 else replace(w, gripper=1.0) for w in plan.right]
    return plan


@pytest.mark.parametrize("task", sorted(TASKS))
def test_the_recorded_demonstrations_finish_the_task(task: str) -> None:
    """Catches demonstrations that teach dropping (R-ALOHA-2): ACT's hand-over replayed in
    the joint-space scene, where the left finger touches the cube once (reward 4) and the
    cube lies on the table at step 400; and an insertion judged done though the peg left
    the socket. Also an expert that no longer reaches the top reward in the scene the
    policy is judged in: a broken end-effector scene (MuJoCo 3's soft welds leave the
    gripper's orientation loose), waypoints planned from the wrong objects, or targets
    without the gripper commands substituted for the gripper joints. Each episode runs its
    400 steps; the top reward and the task done at the last step are both asked for."""
    recorder = Recorder(TASKS[task])
    for seed in (0, 1):
        demo = recorder.demonstrate(seed)
        assert len(demo.action) == 400 and demo.success and demo.finished, (
            task, seed, demo.rewards.max(), demo.rewards[-1])
        if task == "transfer_cube":
            assert demo.rewards[-1] == 4 and demo.env_state[-1][2] > HELD
        else:  # the peg still in the socket, off the table
            assert recorder.scene.task_done(demo.rewards[-1])


def test_prepare_keeps_only_demonstrations_that_finish(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 5, bug 2: `prepare` keeping a demonstration whose replay failed and still
    reporting an expert success rate of 1.0. Seed 3's expert drops the cube before the
    hand-over (no top reward), seed 4's is ACT's hand-over (the top reward, then the cube
    falls), seed 5's finishes: only seed 5 is kept, both failures are counted, and the
    rates say so (field 2/3, finished 1/3)."""
    plans = iter([_opens_right_early, _act_handover, experts.transfer_cube])
    monkeypatch.setitem(experts.EXPERTS, "transfer_cube",
                        lambda *args: next(plans)(*args))
    root = tmp_path / "data"
    report = prepare(root, "transfer_cube", episodes=1, seed=3, max_attempts=3, log=None)
    assert report["seeds"] == [5] and report["failed_seeds"] == [3, 4]
    assert report["attempts"] == 3
    assert report["expert_success_rate"] == pytest.approx(2 / 3)
    assert report["expert_finish_rate"] == pytest.approx(1 / 3)
    assert json.loads((root / INFO_FILE).read_text())["seeds"] == [5]
    frames = LeRobotFrames(root)
    assert [e.length for e in frames.episodes] == [400]
    last = frames.tables.columns["observation.environment_state"][-1]
    assert last[2] > HELD  # the kept episode ends with the cube held


class _Replay:
    """A closed-loop policy sending recorded joint targets, one plan per episode in the
    order the episodes start (one slot)."""

    def __init__(self, plans: list[np.ndarray]) -> None:
        self.plans, self.episode, self.t = plans, -1, 0

    def reset(self, env_index: int) -> None:
        self.episode, self.t = self.episode + 1, 0

    def act(self, observations) -> np.ndarray:
        plan = self.plans[self.episode]
        action = plan[min(self.t, len(plan) - 1)]
        self.t += 1
        return action[None].astype(np.float32)


def test_the_strict_verdict_fails_a_policy_that_drops_the_cube(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an evaluation that counts a dropped cube as a success everywhere: episode 0
    replays the expert (the cube held to the end), episode 1 ACT's hand-over (the left
    finger touches the cube at step ~210, it is on the table by ~280). Both reach the top
    reward (the field's verdict); only episode 0 is done at steps 300 and 400. Also catches
    the judge's success not replacing the predicate's (the environment's `is_success` at
    the last step is false for episode 1) and outcome rates summed instead of averaged."""
    seeds = (EVAL_SEED, EVAL_SEED + 1)
    recorder = Recorder(TASKS["transfer_cube"])
    held = recorder.demonstrate(seeds[0]).targets
    monkeypatch.setitem(experts.EXPERTS, "transfer_cube", _act_handover)
    dropped = recorder.demonstrate(seeds[1])
    assert dropped.success and not dropped.finished
    config = EvaluationConfig.model_validate({
        "env": {"id": "embodichain_models/AlohaTransferCube-v0",
                "import": "embodichain_models.envs",
                "kwargs": {"task": "transfer_cube", "terminate_on_success": False}},
        "episodes": 2, "seed": EVAL_SEED, "max_steps": 400, "envs_per_rank": 1})
    policy = _Replay([held, dropped.targets])
    evaluation = ClosedLoopEvaluation(config, lambda model, device: policy, judge=AlohaJudge)
    result = evaluation.run(None, "cpu", lockstep=False)
    assert result is not None
    first, second = result.records
    assert [r["length"] for r in result.records] == [400, 400]
    assert first["success"] and first["outcomes"] == {
        "strict_success": True, "success_300": True, "strict_success_300": True}
    assert second["success"] and second["outcomes"] == {
        "strict_success": False, "success_300": True, "strict_success_300": False}
    metrics = result.metrics()
    assert metrics["validation/success_rate"] == 1.0
    assert metrics["validation/strict_success_rate"] == 0.5
    assert metrics["validation/success_300_rate"] == 1.0
    assert metrics["validation/strict_success_300_rate"] == 0.5
