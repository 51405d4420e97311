"""A rank's episodes through its slots: one batched policy forward per step (R-EVAL-1..3).

The rank's episodes (e = rank, rank + W, ...) are started in index order, each in the first
free slot, reset with seed `seed + e`; the policy is told (`reset(slot)`, then
`seed_episode(slot, seed + e)` if it has one). Every step, the
policy acts once for all slots (a finished slot's row holds its last observation; its action
is ignored), then every running slot steps. An episode ends when the environment terminates
or truncates it, at `max_steps`, or with a fault: an exception, a non-finite observation or
reward, or its wall-clock limit (`episode_timeout_s`, counting the environment's own time);
a fault fails that episode, with its
reason, and the slot's environment is rebuilt for the next one. The episode's outcome is
`success(info, reward, terminated)` at its last step (default `info["is_success"]`); a
factory's `EpisodeJudge`, when given, sees every step and adds named outcomes (`outcomes`
in the record), its `success` replacing the predicate's. Filming is a side channel
(R-EVAL-5): a frame that cannot be rendered or encoded ends the episode's film, not the
episode, and its record says why (`video_missing`).

`agree(mine, done, stop)` (distributed: under FSDP, whose forward is collective, when
progress is shown, and whenever a stop request is watched) is a collective that says whether
any rank still runs an episode, how many are done, and whether any rank was asked to stop:
ranks then step together (`act_idle`: a rank without a running episode still calls the policy,
as a collective forward needs). A stop asked on any rank ends the evaluation on every rank at
the same step (R-EVAL-4): `interrupted` then holds the agreed stop flags, and the episodes
still running are dropped; a rank asked to stop steps no further slot meanwhile.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# numpy is imported in the functions: it comes with gymnasium, where an evaluation runs,
# and the trainer imports this module whether or not one is configured.
from embodichain.core.evaluation.policy import (
    ClosedLoopPolicy,
    EpisodeJudge,
    MakeJudge,
    Success,
)
from embodichain.core.evaluation.slots import TIMEOUT, Slot
from embodichain.core.evaluation.video import FilmEncoder, NoFrame
from embodichain.core.evaluation.worker import fault


def episode_seed(seed: int, episode: int) -> int:
    """The reset seed of episode `episode`: a function of the evaluation's seed and the
    episode's index only, never of the rank or world size."""
    return seed + episode


@dataclass(frozen=True)
class Plan:
    """What one rank runs."""

    episodes: Sequence[int]  # this rank's episode indices, ascending
    seed: int
    max_steps: int
    timeout_s: float
    filmed: int  # episodes with index < filmed are filmed
    fps: int


@dataclass
class Running:
    """An episode in its slot."""

    index: int
    seed: int
    film: FilmEncoder | None
    env_s: float = 0.0  # the environment's own time so far (the wall-clock limit's)
    video_missing: str | None = None  # why a filmed episode has no film
    total: float = 0.0
    length: int = 0
    judge: EpisodeJudge | None = None


@dataclass
class Outcome:
    """One finished episode: its record (plain JSON) and its film (mp4 bytes, or None)."""

    record: dict[str, Any]
    film: bytes | None = field(default=None, repr=False)


def nonfinite(value: Any) -> bool:
    """Whether an observation (array, number, or a dict / tuple of them) holds a NaN or inf."""
    import numpy as np
    if isinstance(value, Mapping):
        return any(nonfinite(v) for v in value.values())
    if isinstance(value, tuple | list):
        return any(nonfinite(v) for v in value)
    array = np.asarray(value)
    return array.dtype.kind in "fc" and not bool(np.isfinite(array).all())


def to_numpy(actions: Any) -> Any:
    """A policy's actions (torch or numpy, or a dict of them) as numpy."""
    import numpy as np
    if isinstance(actions, Mapping):
        return {k: to_numpy(v) for k, v in actions.items()}
    if hasattr(actions, "detach"):
        return actions.detach().cpu().numpy()
    return np.asarray(actions)


class EpisodeRunner:
    """Runs one rank's `Plan` in its slots with the policy."""

    def __init__(self, slots: Sequence[Slot], policy: ClosedLoopPolicy, plan: Plan,
                 spaces: tuple[Any, Any], success: Success,
                 agree: Callable[[bool, int, int], tuple[bool, int, int]] | None = None,
                 progress: Callable[[int], None] | None = None,
                 judge: MakeJudge | None = None, *,
                 act_idle: bool = True, stop_flag: Callable[[], int] | None = None) -> None:
        import numpy as np
        from gymnasium.vector.utils import batch_space, create_empty_array, iterate

        self.slots, self.policy, self.plan, self.success = slots, policy, plan, success
        self.agree, self.progress, self.make_judge = agree, progress, judge
        self.act_idle, self.stop_flag = act_idle, stop_flag or (lambda: 0)
        self.interrupted = 0  # the stop flags every rank agreed on (0: not cut short)
        self.observation_space, action_space = spaces
        self.batch_actions = batch_space(action_space, len(slots))
        self.iterate = iterate
        self.create_empty_array = create_empty_array
        empty = create_empty_array(self.observation_space, len(slots), fn=np.zeros)
        self.latest: list[Any] = list(iterate(batch_space(self.observation_space, len(slots)),
                                              empty))
        self.running: list[Running | None] = [None] * len(slots)
        self.pending = deque(plan.episodes)
        self.outcomes: list[Outcome] = []

    def run(self) -> list[Outcome]:
        """Every episode of the plan, in index order of their records."""
        for i in range(len(self.slots)):
            self._start(i)
        while True:
            mine = any(r is not None for r in self.running)
            if self.agree is not None:
                anyone, done, stops = self.agree(mine, len(self.outcomes), self.stop_flag())
            else:
                anyone, done, stops = mine, len(self.outcomes), self.stop_flag()
            if self.progress is not None:
                self.progress(done)
            if stops:  # every rank sees the same sum: all end here, before the same forward
                self.interrupted = stops
                break
            if not anyone:
                break
            if mine or self.act_idle:
                actions = self._act()
            if mine:
                self._step(actions)
        return sorted(self.outcomes, key=lambda o: o.record["episode"])

    def _act(self) -> list[Any]:
        from gymnasium.vector.utils import concatenate

        batch = concatenate(self.observation_space, self.latest,
                            self.create_empty_array(self.observation_space, len(self.slots)))
        actions = to_numpy(self.policy.act(batch))
        return list(self.iterate(self.batch_actions, actions))

    # -- one slot's episodes ------------------------------------------------------------

    def _start(self, i: int) -> None:
        """The next episode of this rank in slot `i` (until one starts or none is left)."""
        plan = self.plan
        while self.pending and not self.stop_flag():  # none starts once a stop is asked
            index = self.pending.popleft()
            film = FilmEncoder(plan.fps) if index < plan.filmed else None
            episode = Running(index, episode_seed(plan.seed, index), film,
                              judge=self.make_judge() if self.make_judge else None)
            slot = self.slots[i]
            slot.send("reset", episode.seed, film is not None)
            status, result, seconds = slot.receive(plan.timeout_s)
            episode.env_s += seconds
            if status != "ok":
                self._finish(i, episode, failure=self._fault(status, result, "reset"))
                continue
            obs, _info, frame = result
            if nonfinite(obs):
                self._finish(i, episode, failure="non-finite observation at reset")
                continue
            self._film(episode, frame)
            self.latest[i] = obs
            self.running[i] = episode
            self.policy.reset(i)
            seeded = getattr(self.policy, "seed_episode", None)
            if callable(seeded):  # a stochastic policy's noise follows the episode (R-DP-3)
                seeded(i, episode.seed)
            return

    def _step(self, actions: list[Any]) -> None:
        live = []
        for i, running in enumerate(self.running):
            if running is None:
                continue
            if self.stop_flag():  # a slow sync step each: end sooner; the next agreement stops
                break
            self.slots[i].send("step", actions[i], running.film is not None)
            live.append(i)
        for i in live:
            episode = self.running[i]
            assert episode is not None
            status, result, seconds = self.slots[i].receive(self.plan.timeout_s - episode.env_s)
            episode.env_s += seconds
            if status != "ok":
                self._end(i, episode, failure=self._fault(status, result, "step"))
                continue
            obs, reward, terminated, truncated, info, frame = result
            episode.length += 1
            self._film(episode, frame)
            failure = ("non-finite reward" if not math.isfinite(reward) else
                       "non-finite observation" if nonfinite(obs) else
                       "timeout: the environment ran past episode_timeout_s"
                       if episode.env_s > self.plan.timeout_s else None)
            if failure is not None:
                self._end(i, episode, failure=failure)
                continue
            episode.total += reward
            self.latest[i] = obs
            if episode.judge is not None:
                episode.judge.step(info, reward, terminated, truncated)
            if terminated or truncated or episode.length >= self.plan.max_steps:
                end = ("terminated" if terminated else "truncated" if truncated
                       else "max_steps")
                self._end(i, episode, end=end,
                          success=bool(self.success(info, reward, terminated)))

    def _fault(self, status: str, reason: str, during: str) -> str:
        if status == TIMEOUT:
            return f"timeout: {reason} (during {during})"
        return f"{during}: {reason}"

    def _film(self, episode: Running, frame: Any) -> None:
        """Add the frame to the episode's film; one that cannot be added ends the film (the
        next commands render nothing), never the episode."""
        if episode.film is None or frame is None:
            return
        if isinstance(frame, NoFrame):  # the renderer failed (worker.py)
            self._drop_film(episode, f"frame {episode.film.frames}: {frame.reason}")
            return
        try:
            episode.film.add(frame)
        except Exception as exc:
            self._drop_film(episode, f"frame {episode.film.frames}: {fault(exc)}")

    def _drop_film(self, episode: Running, reason: str) -> None:
        if episode.film is not None:
            episode.film.abandon()
        episode.film, episode.video_missing = None, reason

    def _end(self, i: int, episode: Running, *, failure: str | None = None,
             end: str = "failure", success: bool = False) -> None:
        self.running[i] = None
        self._finish(i, episode, failure=failure, end=end, success=success)
        self._start(i)

    def _finish(self, i: int, episode: Running, *, failure: str | None = None,
                end: str = "failure", success: bool = False) -> None:
        if failure is not None:
            self.slots[i].recover()  # the next episode gets a new environment
        film = frames = None
        if episode.film is not None:
            frames = episode.film.frames
            try:
                film = episode.film.finish()
            except Exception as exc:
                self._drop_film(episode, f"encoding: {fault(exc)}")
            if film is None and episode.video_missing is None:
                episode.video_missing = "no frame was rendered"
        outcomes = None
        if episode.judge is not None:
            outcomes = {str(k): bool(v) and failure is None
                        for k, v in episode.judge.outcomes().items()}
            success = outcomes.pop("success", success)
        record = {"episode": episode.index, "seed": episode.seed,
                  "success": success and failure is None, "return": episode.total,
                  "length": episode.length, "end": end, "failure": failure}
        if outcomes is not None:
            record["outcomes"] = outcomes
        if film is not None:
            record["frames"] = frames
        elif episode.index < self.plan.filmed:
            record["video_missing"] = episode.video_missing
        self.outcomes.append(Outcome(record, film))
