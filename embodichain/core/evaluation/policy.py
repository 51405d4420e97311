"""What the factory gives the evaluation: the policy's side of the closed loop (R-EVAL-1)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class ClosedLoopPolicy(Protocol):
    """A policy acting for a batch of environments (one row per environment slot).

    `reset(i)`: a new episode starts in slot i (clear its history, chunk queue, ...).
    `act(observations)`: the batched observations of every slot, as a gymnasium vector env
    gives them (numpy arrays, or a dict of them, leading dimension = envs_per_rank), to the
    batched actions (numpy or torch, `[envs_per_rank, *action_shape]`). It is called once per
    step for every slot, also slots whose episode has ended (their actions are ignored), so
    that every rank runs the same forwards (a collective forward under FSDP). Action
    chunking, temporal ensembling and normalisation are the policy's business. It should be
    deterministic: the same observations give the same actions, whatever the other rows.
    A stochastic policy (one that samples, as Diffusion Policy) may also have
    `seed_episode(env_index, seed)`: called after `reset(i)` with the episode's reset seed,
    so that it draws the episode's noise from it, whatever the rank or slot.
    """

    def reset(self, env_index: int) -> None: ...

    def act(self, observations: Any) -> Any: ...


MakePolicy = Callable[[Any, Any], ClosedLoopPolicy]
"""`make_policy(model, device) -> ClosedLoopPolicy`: the acting weights (the unwrapped model,
or the EMA's, per `evaluation.acting`), in eval mode, without gradients."""

Success = Callable[[Mapping[str, Any], float, bool], bool]
"""`success(info, reward, terminated) -> bool` at an episode's last step; default:
`info["is_success"]`."""


def default_success(info: Mapping[str, Any], reward: float, terminated: bool) -> bool:
    """The environment's own verdict, `info["is_success"]` (False when it gives none)."""
    return bool(info.get("is_success", False))


@runtime_checkable
class EpisodeJudge(Protocol):
    """Judges one episode from every step, beyond its success (R-EVAL-1): `step(info,
    reward, terminated, truncated)` after each of its steps; `outcomes()` at its end, named
    booleans kept in the episode's record (`outcomes`) and averaged into
    `validation/<name>_rate`. An outcome named `success` is the episode's success (in place
    of the success predicate's). A faulted episode's outcomes are all false."""

    def step(self, info: Mapping[str, Any], reward: float, terminated: bool,
             truncated: bool) -> None: ...

    def outcomes(self) -> Mapping[str, bool]: ...


MakeJudge = Callable[[], EpisodeJudge]
"""`make_judge() -> EpisodeJudge`: a new judge for each episode."""
