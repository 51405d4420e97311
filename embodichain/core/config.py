"""The recipe schema: framework-owned sections, and how a factory's schema joins them (R-CFG-1).

A recipe is one YAML mapping. The framework owns `factory`, `seed`, `device`, `trainer`,
`optimizer` and `scheduler`; every other top-level section belongs to the factory, which
declares it through a `config_schema` attribute (a pydantic model or a dataclass). Both are
validated together in one pass so that every problem is reported at once (see
`core/recipe.py` for loading and `core/config_errors.py` for the messages).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    create_model,
)


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors; assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TrainerConfig(Section):
    batch_size: PositiveInt
    """Examples per worker per update; the global batch is `batch_size * world_size`."""
    max_updates: PositiveInt
    validate_every: NonNegativeInt = 0
    """Validate every N updates on rank 0 (0: never)."""
    save_every: NonNegativeInt = 0
    """Write `step_N.pt` every N updates (0: only `last.pt` at the end)."""
    log_every: PositiveInt = 10
    output_dir: str
    save_best: bool = False
    """Keep `best.pt`, the snapshot with the lowest `validation/mse` so far."""
    keep_last: PositiveInt | None = None
    """Keep only the newest N `step_*.pt` files (default: keep all)."""


class OptimizerConfig(Section):
    name: Literal["adam", "adamw", "sgd"]
    lr: PositiveFloat
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat | None = None
    """Clip the global gradient norm to this value."""


class SchedulerConfig(Section):
    name: Literal["constant", "linear", "cosine"] = "constant"
    end_lr: NonNegativeFloat = 0.0
    """Learning rate reached at `trainer.max_updates` (linear and cosine)."""
    warmup_updates: NonNegativeInt = 0


class FrameworkConfig(Section):
    """The framework-owned part of every recipe."""

    factory: str
    seed: int = 0
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    trainer: TrainerConfig
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig | None = None


# Keys that may change between a checkpoint and the run resuming from it (R-RESUME-2).
RESUMABLE_CHANGES = (
    "trainer.output_dir",
    "trainer.log_every",
    "trainer.validate_every",
    "trainer.save_every",
    "trainer.save_best",
    "trainer.keep_last",
    "trainer.max_updates",
)


def resolved_dict(config: BaseModel) -> dict[str, Any]:
    """The recipe as plain JSON-able data, defaults filled in."""
    return config.model_dump(mode="json")


def config_sha256(resolved: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(resolved).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`; empty sections stay as `{}` values."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_keys(value, name + "."))
        else:
            flat[name] = value
    return flat


_COMBINED: dict[Any, type[BaseModel]] = {}


def combined_schema(recipe_schema: Any) -> type[BaseModel]:
    """One model for the whole recipe: the factory's sections plus the framework's.

    A pydantic schema is combined by inheritance, so its top-level validators see the
    framework fields too (e.g. `self.device`). A dataclass schema contributes its fields.
    """
    if recipe_schema is None:
        return FrameworkConfig
    if recipe_schema in _COMBINED:
        return _COMBINED[recipe_schema]
    if isinstance(recipe_schema, type) and issubclass(recipe_schema, BaseModel):
        combined = type(f"{recipe_schema.__name__}Recipe", (recipe_schema, FrameworkConfig),
                        {"model_config": ConfigDict(extra="forbid", validate_assignment=True)})
    elif dataclasses.is_dataclass(recipe_schema):
        hints = typing.get_type_hints(recipe_schema)
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(recipe_schema):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = ...
            fields[f.name] = (hints[f.name], default)
        combined = create_model(f"{recipe_schema.__name__}Recipe", __base__=FrameworkConfig,
                                **fields)
    else:
        raise TypeError(f"config_schema must be a pydantic model or a dataclass, "
                        f"got {recipe_schema!r}")
    _COMBINED[recipe_schema] = combined
    return combined
