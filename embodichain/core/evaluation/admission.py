"""What is refused before an evaluation runs (exit 2, one message; design R-EVAL-6).

- `check_overrides`: `eval`'s --episodes and --videos;
- `refuse_demonstration_seeds`: evaluation seeds among the seeds the training data was
  recorded with (the policy would be judged on its own demonstrations); where those seeds
  are unknown, `warn_unknown_seeds` says so instead of passing in silence;
- `check_first_act`: the policy given one reset observation of the environment, batched as
  the episodes batch them, before any episode (or training) runs: a policy whose
  observation keys, shapes or dtypes are not the environment's, or whose action does not
  fit its action space, is refused naming both sides, instead of failing at the first step.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

from embodichain.core.errors import UsageError
from embodichain.core.evaluation.envs import EnvSpec, make_env
from embodichain.core.evaluation.policy import ClosedLoopPolicy
from embodichain.core.recipe.evaluation_schema import EvaluationConfig


def check_overrides(episodes: int | None, videos: int | None) -> None:
    """`eval --episodes N` (N >= 1) and `--videos K` (K >= 0)."""
    if episodes is not None and episodes < 1:
        raise UsageError(f"--episodes: expected a positive integer, got {episodes}")
    if videos is not None and videos < 0:
        raise UsageError(f"--videos: expected a non-negative integer, got {videos}")


def refuse_demonstration_seeds(seed: int, episodes: int, demonstrations: Collection[int],
                               what: str) -> None:
    """Refuse evaluation seeds `seed .. seed + episodes - 1` that are among
    `demonstrations` (the environment seeds the training data was recorded with)."""
    overlap = sorted(set(range(seed, seed + episodes)) & set(demonstrations))
    if not overlap:
        return
    shown = ", ".join(map(str, overlap[:5])) + (", ..." if len(overlap) > 5 else "")
    raise UsageError(f"{what}: evaluation seeds {seed}..{seed + episodes - 1} include "
                     f"{len(overlap)} seed(s) the training data was recorded with ({shown}): "
                     "the policy would be judged on its own demonstrations. Choose seeds "
                     f"from {max(demonstrations) + 1} (--seed, evaluation.seed)")


def warn_unknown_seeds(seed: int, episodes: int, why: str | None, what: str) -> None:
    """Warn (rank 0's log) that evaluation seeds `seed .. seed + episodes - 1` cannot be
    checked against the demonstrations' seeds, which are unknown (`why`; None: known)."""
    if why is None:
        return
    logging.getLogger("embodichain").warning(
        "warning: %s: the seeds the training data was recorded with are unknown (%s): "
        "evaluation seeds %d..%d were not checked against them, and the policy may be "
        "judged on its own demonstrations", what, why, seed, seed + episodes - 1)


def describe(space: Any) -> str:
    """An observation space as `{key: [shape] dtype, ...}` (a Box: `[shape] dtype`)."""
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in spaces.items()) + "}"
    shape = getattr(space, "shape", None)
    return f"{list(shape) if shape is not None else '?'} {getattr(space, 'dtype', '')}".strip()


def describe_interface(observations: Mapping[str, Any]) -> str:
    """An interface's observations (`{key: {shape, dtype}}`) as `describe` shows a space."""
    return "{" + ", ".join(f"{k}: {list(v['shape'])} {v.get('dtype', '')}".rstrip()
                           for k, v in observations.items()) + "}"


def check_first_act(config: EvaluationConfig, policy: ClosedLoopPolicy, spaces: Any,
                    takes: str | None, where: str) -> None:
    """Act once on the reset observation of one environment (seed `config.seed`), given in
    every one of the `envs_per_rank` rows;
    UsageError naming the environment's observations and what the policy `takes` (None:
    not declared) when the policy fails or its action does not fit the action space. An
    environment that fails its reset is left to the episodes (a fault fails an episode,
    never the run)."""
    # NumPy comes with gymnasium, not with the framework (training runs without it).
    import numpy as np
    from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

    observation_space, action_space = spaces
    env = make_env(EnvSpec.of(config.env, render=False))
    try:
        try:
            observation, _ = env.reset(seed=config.seed)
        except Exception:  # noqa: BLE001 - the environment's fault: the episode's business
            return
        slots = config.envs_per_rank  # every slot's row, as the episodes' first step
        batch = concatenate(observation_space, [observation] * slots,
                            create_empty_array(observation_space, slots, fn=np.zeros))
        gives = describe(observation_space)
        policy_takes = f"; the policy takes {takes}" if takes else ""
        try:
            policy.reset(0)
            action = policy.act(batch)
        except Exception as exc:  # noqa: BLE001 - any failure here is the policy's misfit
            message = str(exc).splitlines()[0] if str(exc) else ""
            raise UsageError(f"{where} cannot act on the environment's observations "
                             f"({type(exc).__name__}: {message}): the environment gives "
                             f"{gives}{policy_takes}. Nothing was started.") from None
        if hasattr(action, "detach"):
            action = action.detach().cpu().numpy()
        want = batch_space(action_space, slots).shape
        got = None if isinstance(action, Mapping) else np.shape(action)
        if want is not None and got is not None and np.prod(got) != np.prod(want):
            raise UsageError(f"{where} gives actions of shape {list(got)} for "
                             f"{slots} observations; the environment takes {list(want)} "
                             f"({describe(action_space)}). Nothing was started.")
    finally:
        env.close()
