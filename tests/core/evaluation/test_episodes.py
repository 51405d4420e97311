"""A rank's episodes, in this process (R-EVAL-1..3, R-EVAL-5): films as a side channel,
the wall-clock limit, faulted slots rebuilt, the split over ranks and their lockstep, and
the metrics as means over the records.

The environment is `Reach` (tests/factories/closed_loop.py) acted on by `a = w * x` in
numpy; the ranks of `test_ranks_split_round_robin_and_step_in_lockstep` are threads with a
fake process group whose collectives check that every rank is in the same one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from embodichain.core.evaluation import closed_loop
from embodichain.core.evaluation.envs import EnvSpec, check_buildable
from embodichain.core.evaluation.episodes import EpisodeRunner, Outcome, Plan
from embodichain.core.evaluation.policy import default_success
from embodichain.core.evaluation.records import EvaluationResult
from embodichain.core.evaluation.slots import make_slots
from embodichain.core.evaluation.video import decode_frames
from tests.support import FACTORIES

REACH = "closed_loop:make_reach"
OUTCOME = ("episode", "seed", "success", "return", "length", "end", "failure")


@pytest.fixture(scope="module", autouse=True)
def _factories_on_path() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FACTORIES))  # async slots pass sys.path on
        yield


class Gain:
    """`act(obs) = weight * obs`, counting its calls."""

    def __init__(self, weight: float = -1.5) -> None:
        self.weight, self.calls = weight, 0

    def reset(self, env_index: int) -> None:
        pass

    def act(self, observations: np.ndarray) -> np.ndarray:
        self.calls += 1
        return (self.weight * observations).astype(np.float32)


def run_episodes(kwargs: dict[str, Any], *, filmed: int = 0, episodes: int = 4,
                 vector: str = "sync", timeout_s: float = 30.0, max_steps: int = 12,
                 weight: float = -1.5, slots: int = 1) -> list[Outcome]:
    spec = EnvSpec(constructor=REACH, kwargs=kwargs, render=bool(filmed))
    facts = check_buildable(EnvSpec(constructor=REACH, kwargs=kwargs))
    made = make_slots(spec, slots, vector)
    try:
        runner = EpisodeRunner(made, Gain(weight), Plan(range(episodes), 100, max_steps,
                                                        timeout_s, filmed, 10),
                               (facts.observation_space, facts.action_space), default_success)
        return runner.run()
    finally:
        for slot in made:
            slot.close()


def outcomes(found: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [{k: o.record[k] for k in OUTCOME} for o in found]


@pytest.fixture(scope="module")
def unfilmed() -> list[dict[str, Any]]:
    found = outcomes(run_episodes({}))
    assert {r["success"] for r in found} == {True} and all(r["length"] > 2 for r in found)
    return found


@pytest.mark.parametrize("frames,vector", [("rgb", "sync"), ("gray", "sync"),
                                           ("float", "sync"), ("raise", "sync"),
                                           ("raise", "async"), ("slow", "sync")])
def test_filming_never_changes_an_episodes_outcome(unfilmed: list[dict[str, Any]],
                                                   frames: str, vector: str) -> None:
    """Every episode filmed, by a renderer giving RGB, grayscale `[H, W]` or float [0, 1]
    frames, failing from step 2 on, or taking 0.3 s a frame under a 1 s limit: the episodes'
    outcomes are those without films. Catches: a render failure failing the episode (ALOHA:
    success 1.0 unfilmed, 0.5 filmed), a grayscale frame raising out of the evaluation, a
    float frame cast to black, and rendering counted in the episode's wall-clock limit."""
    timeout_s = 1.0 if frames == "slow" else 30.0
    if frames == "slow":
        assert outcomes(run_episodes({}, timeout_s=timeout_s, episodes=2)) == unfilmed[:2]
    found = run_episodes({"frames": frames, "sleep_s": 0.3}, filmed=4, vector=vector,
                         timeout_s=timeout_s, episodes=2 if frames == "slow" else 4)
    assert outcomes(found) == unfilmed[:len(found)]
    if frames == "raise":  # the film is dropped, its reason recorded; the episode goes on
        for o in found:
            assert o.film is None and "frames" not in o.record
            assert o.record["video_missing"] == \
                "frame 2: render: RuntimeError: the renderer lost its GL context", o.record
        return
    for o in found:
        assert "video_missing" not in o.record
        films = decode_frames(o.film)
        assert len(films) == o.record["frames"] == o.record["length"] + 1
        first = films[0].astype(int)
        lit = first[:, :, 0].max(axis=0).argmax()  # the point's column, bright
        assert first[:, lit].mean() > 120 and abs(np.median(first) - 30) <= 6, frames
        if frames == "gray":  # its one channel on all three
            assert np.abs(first[..., 0] - first[..., 2]).max() <= 12


def test_frames_that_cannot_be_encoded_drop_the_film_with_the_reason() -> None:
    """Catches a frame of another size mid-film, or not an image at all, raising out of the
    evaluation (a training run would end) instead of dropping that film."""
    from embodichain.core.evaluation.video import FilmEncoder, rgb_frame

    assert rgb_frame(np.full((4, 6), 7, np.uint16)).shape == (4, 6, 3)
    assert rgb_frame(np.ones((4, 6, 1), bool)).max() == 255
    assert rgb_frame(np.full((2, 2, 4), 200.0)).max() == 200  # float in [0, 255]
    for bad, why in ((np.zeros((2, 2, 2), np.uint8), "shape [2, 2, 2]"),
                     (np.full((2, 2, 3), np.nan), "NaN"),
                     (np.full((2, 2, 3), 300.0), "[300, 300]"),
                     (None, "returned None")):
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
            rgb_frame(bad)
    film = FilmEncoder(10)
    film.add(np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="size changed from 8x8 to 10x10"):
        film.add(np.zeros((10, 10, 3), np.uint8))
    film.abandon()


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_films_where_nothing_renders_are_refused_when_the_evaluation_starts(
        monkeypatch: pytest.MonkeyPatch, vector: str) -> None:
    """An environment that cannot render (as MuJoCo without OpenGL): `videos: 2` is refused
    when the evaluation is built, `eval --videos 1` of a section filming nothing before its
    episodes, both naming MUJOCO_GL (async: the frame is tried in a slot's own process).
    Catches a run that films where nothing renders (every film missing, found out after
    training) and `eval --videos K` skipping the check."""
    from embodichain.core.errors import UsageError
    from embodichain.core.recipe.evaluation_schema import EvaluationConfig

    monkeypatch.setenv("REACH_NO_GL", "1")

    def section(videos: int) -> EvaluationConfig:
        return EvaluationConfig.model_validate({"env": {"constructor": REACH}, "episodes": 2,
                                                "videos": videos, "vector": vector})

    with pytest.raises(UsageError) as refused:
        closed_loop.ClosedLoopEvaluation(section(2), lambda model, device: Gain())
    said = str(refused.value)
    assert said.startswith("evaluation.videos: episodes are to be filmed") and \
        "REACH_NO_GL is set" in said and "MUJOCO_GL" in said and \
        "(evaluation.videos: 0)" in said, said
    unfilmed = closed_loop.ClosedLoopEvaluation(section(0), lambda model, device: Gain())
    with pytest.raises(UsageError, match=r"^--videos: .*MUJOCO_GL.*\(--videos 0\)"):
        unfilmed.run(None, "cpu", lockstep=False, overrides=closed_loop.Overrides(videos=1))


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_the_wall_clock_limit_is_the_episodes_not_each_steps(vector: str) -> None:
    """Steps of 0.9 s under `episode_timeout_s: 1`, policy idle (the point never arrives):
    the episode fails on timeout at its second step, async cut off at 1 s. Catches the
    limit applied per step (each 0.9 s step is within it, the episode never times out)."""
    found = run_episodes({"sleep_at": 100, "sleep_s": 0.9}, episodes=1, vector=vector,
                         timeout_s=1.0, max_steps=10, weight=0.0)
    record = found[0].record
    # The episode's own record, not the test's clock (a loaded CI machine once took 9 s for
    # this test): under a per-step limit it would run all ten steps and end on max_steps.
    assert record["failure"] is not None and record["failure"].startswith("timeout"), record
    assert record["length"] <= 2 and not record["success"]


@pytest.mark.parametrize("vector", ["sync", "async"])
def test_a_slot_whose_environment_faulted_is_rebuilt_before_its_next_episode(vector: str
                                                                             ) -> None:
    """One slot; its environment raises in episode 1 and then stays broken (as a simulator
    whose state a fault corrupted). Catches the slot not rebuilt after the fault: the
    following episodes, in the same broken environment, fail too."""
    found = [o.record for o in run_episodes({"raise_at": 101, "stays_broken": True},
                                            episodes=4, vector=vector)]
    assert "the simulator broke at step 3" in found[1]["failure"]
    assert [r["failure"] for r in found[2:]] == [None, None], found
    assert [r["success"] for r in found] == [True, False, True, True]


class FakeGroup:
    """The ranks of a process group as threads: each collective checks that every rank is
    in the same one (a rank that skips a collective forward is caught, not hung)."""

    def __init__(self, world: int) -> None:
        self.world, self.local = world, threading.local()
        self.barrier = threading.Barrier(world, timeout=30)
        self.box: list[Any] = [None] * world
        self.errors: list[BaseException] = []

    def rank(self) -> int:
        return self.local.rank

    def exchange(self, what: str, value: Any) -> list[Any]:
        self.box[self.rank()] = (what, value)
        self.barrier.wait()
        got = list(self.box)
        self.barrier.wait()
        kinds = {k for k, _ in got}
        assert len(kinds) == 1, f"broken lockstep: the ranks are in {sorted(kinds)} at once"
        return [v for _, v in got]

    def sum_over_ranks(self, values: list[int]) -> list[int]:
        return [sum(column) for column in zip(*self.exchange("sum", values), strict=True)]

    def gather_to_rank_zero(self, value: Any) -> list[Any] | None:
        got = self.exchange("gather", value)
        return got if self.rank() == 0 else None

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        group = closed_loop.process_group
        monkeypatch.setattr(group, "world_size", lambda: self.world)
        monkeypatch.setattr(group, "rank", self.rank)
        monkeypatch.setattr(group, "is_rank_zero", lambda: self.rank() == 0)
        monkeypatch.setattr(group, "is_distributed", lambda: True)
        monkeypatch.setattr(group, "sum_over_ranks", self.sum_over_ranks)
        monkeypatch.setattr(group, "gather_to_rank_zero", self.gather_to_rank_zero)

    def run(self, job: Any) -> list[Any]:
        results: list[Any] = [None] * self.world

        def rank_main(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = job(rank)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)
                self.barrier.abort()

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if self.errors:
            raise self.errors[0]
        return results


class CollectivePolicy(Gain):
    """A policy whose forward is a collective, as FSDP's: every rank must call it together."""

    def __init__(self, group: FakeGroup) -> None:
        super().__init__()
        self.group = group

    def act(self, observations: np.ndarray) -> np.ndarray:
        self.group.exchange("forward", len(observations))
        return super().act(observations)


@pytest.mark.parametrize("episodes", [5, 7])
def test_ranks_split_round_robin_and_step_in_lockstep(monkeypatch: pytest.MonkeyPatch,
                                                      episodes: int) -> None:
    """2 ranks of 2 slots, 5 or 7 episodes of different lengths, a collective forward.
    Catches: episodes split in contiguous blocks of `episodes // world` (the remainder is
    lost; 6 on 2 ranks cannot show it), a rank whose episodes ended skipping a forward, or
    leaving the loop while its peer still steps (broken lockstep: the ranks are caught in
    different collectives), and calls counted unequally."""
    from embodichain.core.recipe.evaluation_schema import EvaluationConfig

    group = FakeGroup(2)
    group.install(monkeypatch)
    config = EvaluationConfig.model_validate(
        {"env": {"constructor": REACH}, "episodes": episodes, "seed": 100, "max_steps": 12,
         "envs_per_rank": 2})
    policies = [CollectivePolicy(group) for _ in range(2)]
    evaluation = closed_loop.ClosedLoopEvaluation(config, lambda model, device: policies[
        group.rank()])
    gathered: list[Any] = []
    real_gather = group.gather_to_rank_zero
    monkeypatch.setattr(closed_loop.process_group, "gather_to_rank_zero",
                        lambda value: gathered.append((group.rank(), value))
                        or real_gather(value))
    results = group.run(lambda rank: evaluation.run(None, "cpu", lockstep=True))
    per_rank = {rank: [o.record["episode"] for o in value] for rank, value in gathered}
    assert per_rank == {0: list(range(0, episodes, 2)), 1: list(range(1, episodes, 2))}
    records = results[0].records
    assert [r["episode"] for r in records] == list(range(episodes))
    assert len({r["length"] for r in records}) > 1  # the ranks finish at different steps
    assert policies[0].calls == policies[1].calls > 0
    assert results[1] is None


def test_metrics_are_means_over_the_episode_records() -> None:
    """Hand-computed from three records. Catches `validation/return` or
    `validation/episode_length` summed over the episodes instead of averaged (a test that
    compares the metric only with itself passes either)."""
    records = [{"episode": e, "success": s, "return": g, "length": n, "failure": f}
               for e, (s, g, n, f) in enumerate([(True, -1.5, 3, None), (False, -4.0, 8, "x"),
                                                 (True, -0.5, 4, None)])]
    metrics = EvaluationResult(records).metrics()
    assert metrics == {"validation/success_rate": pytest.approx(2 / 3),
                       "validation/return": pytest.approx(-6.0 / 3),
                       "validation/episode_length": pytest.approx(15 / 3),
                       "validation/episode_failures": 1.0}


class CountingResets(Gain):
    """`Gain`, counting the episodes started in its slots (`reset`)."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0

    def reset(self, env_index: int) -> None:
        self.resets += 1


def test_no_episode_starts_once_a_stop_is_asked() -> None:
    """Catches the scheduler ignoring the stop flag (R-EVAL-4): with a stop asked as the
    first of 4 episodes ends, the next one must not start (its reset would run a simulator
    for an episode that is dropped anyway, delaying the snapshot the stop waits for). One
    slot, in this process: the first episode's record alone, and one reset."""
    spec = EnvSpec(constructor=REACH, kwargs={})
    facts = check_buildable(spec)
    made = make_slots(spec, 1, "sync")
    policy = CountingResets()
    runner: EpisodeRunner | None = None

    def stop_flag() -> int:
        return int(runner is not None and len(runner.outcomes) >= 1)

    try:
        runner = EpisodeRunner(made, policy, Plan(range(4), 100, 12, 30.0, 0, 10),
                               (facts.observation_space, facts.action_space), default_success,
                               stop_flag=stop_flag)
        found = runner.run()
    finally:
        for slot in made:
            slot.close()
    assert [o.record["episode"] for o in found] == [0] and runner.interrupted == 1
    assert policy.resets == 1
