"""The closed-loop evaluation of a recipe, on every rank (R-EVAL-1, R-EVAL-2).

Built with the trainer (the environment is built once there: one that cannot be is refused
before training, R-EVAL-3). `run` is collective: every rank runs its episodes (e mod W ==
rank) with the policy the factory makes of the acting weights, and rank 0 receives every
rank's records and films (one gather), merged by episode index. Given the run's stop request,
the ranks agree between steps whether any was asked to stop, and a stop ends the evaluation
early on every rank: `Interrupted`, never a result (R-EVAL-4).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from embodichain.core.distributed import process_group
from embodichain.core.distributed.stop_request import StopRequest, signal_name, signal_of
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.envs import EnvSpec, check_buildable
from embodichain.core.evaluation.episodes import EpisodeRunner, Plan
from embodichain.core.evaluation.policy import (
    ClosedLoopPolicy,
    MakeJudge,
    MakePolicy,
    Success,
    default_success,
)
from embodichain.core.evaluation.records import EvaluationResult
from embodichain.core.evaluation.slots import check_renders, make_slots
from embodichain.core.evaluation.video import av_module
from embodichain.core.recipe.evaluation_schema import EvaluationConfig


@dataclass(frozen=True)
class Overrides:
    """What `embodichain eval` may change of the recipe's section (None: the recipe's)."""

    episodes: int | None = None
    seed: int | None = None
    videos: int | None = None
    validation: bool = False
    """Judge the validation seeds themselves (`evaluation.seed`), labelled so: to choose
    between ways of acting as the recipe's validation would, before a test report."""


class Interrupted(Exception):  # noqa: N818 (what happened, not an error: the run stops)
    """The evaluation was cut short by a stop that every rank agreed on (R-EVAL-4), on
    every rank. `finished`: on rank 0, the episodes that ended before it (None elsewhere);
    never a metric."""

    def __init__(self, signum: int, finished: EvaluationResult | None, episodes: int) -> None:
        super().__init__(f"the evaluation was cut short by {signal_name(signum)}")
        self.signum, self.finished, self.episodes = signum, finished, episodes


class ClosedLoopEvaluation:
    """The recipe's `evaluation` section with the factory's policy, success predicate and
    episode judge."""

    def __init__(self, config: EvaluationConfig, make_policy: MakePolicy | None,
                 success: Success | None = None, factory: str = "the factory",
                 judge: MakeJudge | None = None) -> None:
        if make_policy is None:
            raise UsageError(
                f"the recipe has an evaluation section, but {factory} gives the trainer no "
                "policy to act in the environment: the factory passes "
                "SupervisedTrainer(policy=make_policy), where make_policy(model, device) "
                "returns an object with reset(env_index) and act(observations) (docs/"
                "evaluation.md); or remove the evaluation section")
        self.config = config
        self.make_policy = make_policy
        self.success = success or default_success
        self.judge = judge
        self.facts = check_buildable(EnvSpec.of(config.env, render=False))
        self.films_checked = False
        if config.videos:  # refused before training: PyAV missing, an env that cannot render
            self.check_films("evaluation.videos", "evaluation.videos: 0")

    def check_films(self, asked: str, none: str) -> None:
        """Refuse (UsageError, exit 2) films that cannot be made: PyAV missing, an
        environment that cannot render a frame (checked once)."""
        if not self.films_checked:
            av_module()
            check_renders(EnvSpec.of(self.config.env, render=True), self.config.vector,
                          asked, none)
            self.films_checked = True

    def run(self, model: Any, device: Any, *, lockstep: bool, overrides: Overrides = Overrides(),
            progress: Any = None, stop: StopRequest | None = None) -> EvaluationResult | None:
        """Every rank runs its episodes; rank 0 gets the result (None elsewhere).

        `lockstep`: ranks step together, each calling the policy as often as the others
        (a collective forward, FSDP); `progress(done, total)` is called on rank 0. `stop`:
        the run's stop request, looked at between steps (every rank agrees: the same on
        every rank); one asked raises `Interrupted` on every rank."""
        c = self.config
        episodes = overrides.episodes if overrides.episodes is not None else c.episodes
        seed = overrides.seed if overrides.seed is not None else c.seed
        videos = overrides.videos if overrides.videos is not None else c.videos
        if videos:  # `eval --videos K` of a recipe that films nothing: checked here
            self.check_films("--videos", "--videos 0")
        world, rank = process_group.world_size(), process_group.rank()
        fps = c.video_fps or self.facts.render_fps or 30
        plan = Plan(range(rank, episodes, world), seed, c.max_steps, c.episode_timeout_s,
                    min(videos, episodes), fps)
        spec = EnvSpec.of(c.env, render=bool(plan.filmed))
        started = time.perf_counter()
        policy: ClosedLoopPolicy = self.make_policy(model, device)
        slots = make_slots(spec, c.envs_per_rank, c.vector)
        show = (lambda done: progress(done, episodes)) if progress is not None and \
            process_group.is_rank_zero() else None
        # Ranks step together for a collective forward, for rank 0's count of every rank's
        # episodes, and to agree on a stop between steps (one small all-reduce per step).
        step_together = (lockstep or stop is not None) and process_group.is_distributed()
        try:
            runner = EpisodeRunner(slots, policy, plan,
                                   (self.facts.observation_space, self.facts.action_space),
                                   self.success, _agree if step_together else None, show,
                                   self.judge, act_idle=lockstep,
                                   stop_flag=(lambda: int(stop.flag)) if stop else None)
            outcomes = runner.run()
        finally:
            for slot in slots:
                slot.close()
        gathered = process_group.gather_to_rank_zero(outcomes)
        merged = None if gathered is None else \
            EvaluationResult.merge(gathered, fps, time.perf_counter() - started)
        if runner.interrupted:
            signum = signal_of(runner.interrupted)
            assert signum is not None
            raise Interrupted(signum, merged, episodes)
        return merged


def _agree(mine: bool, done: int, stop: int) -> tuple[bool, int, int]:
    """Whether any rank still runs an episode, the episodes done on all ranks, and the sum
    of the ranks' stop flags (0: none was asked to stop)."""
    running, finished, stops = process_group.sum_over_ranks([int(mine), done, stop])
    return running > 0, finished, stops
