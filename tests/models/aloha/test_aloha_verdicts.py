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
    """Catches demonstrations that teach dropping (R-ALOHA-2, R-TRUST-1): ACT's hand-over
    replayed in the joint-space scene, where the left finger touches the cube once (reward
    4) and the cube lies on the table at step 400; and an insertion whose peg left the pin
    before the end (ACT's arms stop pressing at step 340). Also an expert that no longer
    reaches the top reward in the scene the policy is judged in: a broken end-effector
    scene (MuJoCo 3's soft welds leave the gripper's orientation loose), waypoints planned
    from the wrong objects, or targets without the gripper commands substituted for the
    gripper joints. Each episode runs its 400 steps; the top reward is asked for at the
    last step."""
    recorder = Recorder(TASKS[task])
    for seed in (0, 1):
        demo = recorder.demonstrate(seed)
        assert len(demo.action) == 400 and demo.success and demo.finished, (
            task, seed, demo.rewards.max(), demo.rewards[-1])
        assert demo.rewards[-1] == 4  # the top reward's own condition at the last step
        if task == "transfer_cube":
            assert demo.env_state[-1][2] > HELD


def _act_insertion_end(left, right, objects):
    """ACT's own insertion plan: the arms hold still from step 340 (no press)."""
    from dataclasses import replace

    plan = experts.insertion(left, right, objects)
    plan.left[-1], plan.right[-1] = replace(plan.left[-2], t=400), replace(plan.right[-2], t=400)
    return plan


def _peg_depth(env_state: np.ndarray) -> float:
    """How far (m) the peg's end is inside the socket, along the socket's axis."""
    import mujoco

    peg, socket = env_state[:7], env_state[7:14]
    rotation = np.empty(9)
    mujoco.mju_quat2Mat(rotation, socket[3:])
    offset = rotation.reshape(3, 3).T @ (peg[:3] - socket[:3])
    return PEG_HALF + SOCKET_HALF - abs(offset[0])


PEG_HALF = SOCKET_HALF = 0.06  # half the peg's and the socket's lengths (gym-aloha's scene)


def test_an_insertion_resting_short_of_the_pin_is_not_finished(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """R-TRUST-1. Catches a strict insertion rule looser than the reward's: the former
    geometric one (the peg 5 mm into the socket) called done a peg that touched the pin
    (reward 4) and then sprang back to rest short of it, so strict (66%) exceeded the
    field's verdict (64%). Two such pegs: one placed 6 mm in, its axis on the socket's
    (the scene's state set directly), and ACT's own plan replayed, whose arms stop
    pressing at step 340 and whose peg ends ~17 mm in, off the pin (reward 2)."""
    from embodichain_models.envs.aloha.scene import Scene

    scene = Scene(TASKS["insertion"])
    scene.reset(seed=EVAL_SEED)
    physics = scene.physics
    socket = physics.data.qpos[23:30].copy()
    axis = np.empty(9)
    import mujoco

    mujoco.mju_quat2Mat(axis, socket[3:])
    depth = 0.006
    peg = socket.copy()  # the socket's orientation, on its axis, 6 mm in from its +x end
    peg[:3] = socket[:3] + axis.reshape(3, 3)[:, 0] * (PEG_HALF + SOCKET_HALF - depth)
    physics.data.qpos[16:23] = peg
    physics.forward()
    reward = float(scene._task.get_reward(physics))
    state = physics.data.qpos[16:30]
    assert _peg_depth(state) == pytest.approx(depth, abs=1e-9)
    assert reward < 4 and not scene.task_done(reward)

    monkeypatch.setitem(experts.EXPERTS, "insertion", _act_insertion_end)
    demo = Recorder(TASKS["insertion"]).demonstrate(0)
    assert demo.success and not demo.finished, demo.rewards[-1]
    assert 0.01 < _peg_depth(demo.env_state[-1]) < 0.02  # in the socket, off the pin


def test_the_strict_verdict_never_counts_what_the_field_does_not() -> None:
    """R-TRUST-1, a property over constructed episodes (rewards 0-4, an environment's
    `task_done` true or false or absent, early termination): strict implies the field's
    verdict at both limits, and needs the top reward at the judged step. Catches a judge
    trusting an environment's `task_done` alone (an environment whose own rule is looser
    than the reward's, as the former insertion rule was), and strict at step 300 judged
    without the top reward reached by then."""
    import random

    rng = random.Random(0)
    seen = {"strict": 0, "field_only": 0}
    for _ in range(400):
        judge = AlohaJudge(also_at=5)
        length = rng.randint(1, 9)
        rewards = [rng.choice([0, 2, 3, 4, 4]) for _ in range(length)]
        for t, reward in enumerate(rewards):
            done = rng.choice([True, False, None])
            info = {} if done is None else {"task_done": done}
            terminated = t == length - 1 and rng.random() < 0.2
            judge.step(info, float(reward), terminated, False)
        got = judge.outcomes()
        assert not got["strict_success"] or (got["success"] and rewards[-1] == 4), rewards
        assert not got["strict_success_5"] or (got["success_5"] and length >= 5
                                               and rewards[4] == 4), rewards
        seen["strict"] += got["strict_success"]
        seen["field_only"] += got["success"] and not got["strict_success"]
    assert seen["strict"] > 20 and seen["field_only"] > 20  # both kinds were constructed
    judge = AlohaJudge()  # an environment calling a state without the top reward done
    for reward in (4.0, 3.0):
        judge.step({"task_done": True}, reward, False, False)
    assert judge.outcomes()["success"] and not judge.outcomes()["strict_success"]


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
    info = json.loads((root / INFO_FILE).read_text())
    assert info["seeds"] == [5] and info["finish_rule"] == "top reward at the last step"
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
