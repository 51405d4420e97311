"""The closed-loop evaluation of a recipe, on every rank (R-EVAL-1, R-EVAL-2).

Built with the trainer (the environment is built once there: one that cannot be is refused
before training, R-EVAL-3). `run` is collective: every rank runs its episodes (e mod W ==
rank) with the policy the factory makes of the acting weights, and rank 0 receives every
rank's records and films (one gather), merged by episode index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from embodichain.core.distributed import process_group
from embodichain.core.errors import UsageError
from embodichain.core.evaluation.envs import EnvSpec, check_buildable
from embodichain.core.evaluation.episodes import EpisodeRunner, Plan
from embodichain.core.evaluation.policy import (
    ClosedLoopPolicy,
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


class ClosedLoopEvaluation:
    """The recipe's `evaluation` section with the factory's policy and success predicate."""

    def __init__(self, config: EvaluationConfig, make_policy: MakePolicy | None,
                 success: Success | None = None, factory: str = "the factory") -> None:
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
            progress: Any = None) -> EvaluationResult | None:
        """Every rank runs its episodes; rank 0 gets the result (None elsewhere).

        `lockstep`: ranks step together, each calling the policy as often as the others
        (a collective forward, FSDP); `progress(done, total)` is called on rank 0."""
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
        step_together = lockstep and process_group.is_distributed()
        try:
            runner = EpisodeRunner(slots, policy, plan,
                                   (self.facts.observation_space, self.facts.action_space),
                                   self.success, _any_rank_running if step_together else None,
                                   show)
            outcomes = runner.run()
        finally:
            for slot in slots:
                slot.close()
        gathered = process_group.gather_to_rank_zero(outcomes)
        if gathered is None:
            return None
        return EvaluationResult.merge(gathered, fps, time.perf_counter() - started)


def _any_rank_running(mine: bool, done: int) -> tuple[bool, int]:
    """Whether any rank still runs an episode, and the episodes done on all ranks."""
    running, finished = process_group.sum_over_ranks([int(mine), done])
    return running > 0, finished
