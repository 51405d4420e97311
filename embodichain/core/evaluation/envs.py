"""Building the evaluation's environments: a registered gymnasium id, or a constructor.

`EnvSpec` is the plain, picklable form of `evaluation.env` (a worker process builds its own
environment from it). `check_buildable` builds one environment and closes it again before
training: an environment that cannot be built (gymnasium or the simulator not installed,
an unknown id, a constructor that fails) is refused there (exit 2, R-EVAL-3).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from embodichain.core.errors import UsageError

EVAL_HINT = "pip install 'embodichain-sl[eval]'"


@dataclass(frozen=True)
class EnvSpec:
    """How to build one environment (see EnvConfig in core/recipe/evaluation_schema.py)."""

    id: str | None = None
    import_module: str | None = None
    constructor: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    render: bool = False  # built with render_mode="rgb_array" (episodes are filmed)

    @classmethod
    def of(cls, env: Any, render: bool) -> EnvSpec:
        """From the recipe's `evaluation.env` section."""
        return cls(env.id, env.import_module, env.constructor, dict(env.kwargs), render)

    @property
    def name(self) -> str:
        return self.id if self.id is not None else str(self.constructor)


def gymnasium_module() -> Any:
    """gymnasium, or a UsageError saying how to install it."""
    try:
        import gymnasium
    except ImportError:
        raise UsageError("the recipe's evaluation section needs gymnasium, which is not "
                         f"installed; install it with: {EVAL_HINT}") from None
    return gymnasium


def make_env(spec: EnvSpec) -> Any:
    """A new environment (raises whatever building it raises)."""
    gym = gymnasium_module()
    kwargs = dict(spec.kwargs)
    if spec.render:
        kwargs["render_mode"] = "rgb_array"
    if spec.import_module:
        importlib.import_module(spec.import_module)
    if spec.id is not None:
        return gym.make(spec.id, **kwargs)
    module, _, attribute = str(spec.constructor).partition(":")
    target: Any = importlib.import_module(module)
    for part in attribute.split("."):
        target = getattr(target, part)
    env = target(**kwargs)
    if not isinstance(env, gym.Env):
        raise TypeError(f"{spec.constructor} returned {type(env).__name__}, not a "
                        "gymnasium.Env")
    return env


@dataclass(frozen=True)
class EnvFacts:
    """What the evaluation needs to know of an environment before it runs one."""

    observation_space: Any
    action_space: Any
    render_fps: int | None


def check_buildable(spec: EnvSpec) -> EnvFacts:
    """Build one environment and close it; refuse (UsageError, exit 2) one that cannot be
    built, naming it and the cause."""
    try:
        env = make_env(spec)
    except UsageError:
        raise
    except Exception as exc:
        where = f" (after importing {spec.import_module})" if spec.import_module else ""
        raise UsageError(f"evaluation.env: {spec.name!r}{where} cannot be built: "
                         f"{type(exc).__name__}: {exc}. Nothing was started.") from None
    try:
        fps = env.metadata.get("render_fps") if isinstance(env.metadata, Mapping) else None
        return EnvFacts(env.observation_space, env.action_space,
                        int(fps) if isinstance(fps, int | float) and fps > 0 else None)
    finally:
        env.close()

