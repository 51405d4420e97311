"""Recipe schemas, YAML loading, `--set` overrides and readable validation errors (R-CFG-1..5).

A recipe is one YAML mapping. The framework owns `factory`, `seed`, `device`, `trainer`,
`optimizer` and `scheduler`; every other top-level section belongs to the factory, which
declares it through a `config_schema` attribute (a pydantic model or a dataclass). Both are
validated together in one pass so that every problem is reported at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    create_model,
)

from embodichain.core.errors import ConfigError


class Section(BaseModel):
    """Base of every recipe section: unknown keys are errors, values are re-checked on assignment."""

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


@dataclass(frozen=True)
class Recipe:
    """A validated recipe: the typed config and the factory that builds its trainer."""

    config: FrameworkConfig
    factory: Callable[..., Any]
    source: str | None = None

    @property
    def resolved(self) -> dict[str, Any]:
        return resolved_dict(self.config)


def resolved_dict(config: BaseModel) -> dict[str, Any]:
    """The recipe as plain JSON-able data, defaults filled in."""
    return config.model_dump(mode="json")


def config_sha256(resolved: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(resolved).encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


# ----------------------------------------------------------------------------------------
# Loading


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """Parse a recipe file into a mapping, with line and column on YAML syntax errors."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([f"recipe file not found: {path}"]) from None
    except OSError as exc:
        raise ConfigError([f"cannot read recipe file {path}: {exc.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError([f"YAML syntax error at {where}: {exc.problem}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"YAML error: {exc}"], str(path)) from None
    if data is None:
        raise ConfigError(["the file is empty; expected a mapping with `factory`, `trainer`, ..."],
                          str(path))
    if not isinstance(data, dict):
        raise ConfigError([f"expected a mapping at the top level, got {type(data).__name__}"],
                          str(path))
    return data


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides; values are YAML scalars, typed later by the schema."""
    result = json.loads(json.dumps(raw))  # deep copy of plain data
    problems = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"--set {item!r}: expected KEY=VALUE, e.g. optimizer.lr=0.01")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else text
        except yaml.YAMLError:
            value = text
        node = result
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {key}: {'.'.join(parts[: depth + 1])} is not a section")
                break
            node = child
        else:
            node[parts[-1]] = value
    if problems:
        raise ConfigError(problems)
    return result


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override and validate a recipe file; raises ConfigError listing every problem."""
    raw = apply_overrides(read_recipe_file(path), overrides)
    return validate_recipe(raw, source=str(path))


def validate_recipe(raw: Mapping[str, Any], source: str | None = None) -> Recipe:
    """Validate a recipe mapping against the framework schema and its factory's schema."""
    from embodichain.plugins.discovery import FactoryError, resolve_factory

    problems: list[str] = []
    factory = None
    factory_ref = raw.get("factory")
    if factory_ref is None:
        pass  # reported by the schema as a missing key
    elif not isinstance(factory_ref, str):
        problems.append(f"factory: expected a name or 'module:attribute', got {factory_ref!r}")
    else:
        try:
            factory = resolve_factory(factory_ref)
        except FactoryError as exc:
            problems.append(f"factory: {exc}")

    if factory is None:
        # Still check the framework's own sections, so that every problem shows at once.
        framework_part = {k: v for k, v in raw.items() if k in FrameworkConfig.model_fields}
        problems += _validation_problems(FrameworkConfig, framework_part)
        raise ConfigError(_dedupe(problems), source)

    schema = combined_schema(getattr(factory, "config_schema", None))
    try:
        config = schema.model_validate(dict(raw))
    except ValidationError as exc:
        raise ConfigError(problems + format_validation_error(exc, schema), source) from None
    if problems:
        raise ConfigError(problems, source)
    return Recipe(config=config, factory=factory, source=source)


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _validation_problems(schema: type[BaseModel], raw: Mapping[str, Any]) -> list[str]:
    try:
        schema.model_validate(dict(raw))
    except ValidationError as exc:
        return format_validation_error(exc, schema)
    return []


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


# ----------------------------------------------------------------------------------------
# Error messages

_TYPE_TEXT = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a mapping",
    "model_type": "expected a mapping",
    "model_attributes_type": "expected a mapping",
    "dataclass_type": "expected a mapping",
    "path_not_file": "file not found",
    "path_not_directory": "directory not found",
}


def format_validation_error(exc: ValidationError, schema: type[BaseModel]) -> list[str]:
    """Turn pydantic errors into `key.path: what was expected, got VALUE` lines."""
    problems = []
    seen_locs = set()
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        # Union members produce one error each; the first one is enough for the user.
        key = ".".join(p for p in loc if not _is_union_tag(p))
        if key in seen_locs and err["type"] != "extra_forbidden":
            continue
        seen_locs.add(key)
        path = key or "(recipe)"
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            parent = [p for p in loc[:-1] if not _is_union_tag(p)]
            hint = _did_you_mean(schema, parent, loc[-1])
            problems.append(f"{path}: unknown key{hint}")
            continue
        if kind == "missing":
            problems.append(f"{path}: required key is missing")
            continue
        if kind == "greater_than":
            text = ("expected a positive number" if ctx.get("gt") == 0
                    else f"expected a value greater than {ctx.get('gt')}")
        elif kind == "greater_than_equal":
            text = f"expected a value of at least {ctx.get('ge')}"
        elif kind == "literal_error":
            text = f"expected one of {ctx.get('expected')}"
        elif kind == "value_error":
            text = str(ctx.get("error", err["msg"]))
            problems.append(f"{path}: {text}")
            continue
        else:
            text = _TYPE_TEXT.get(kind, err["msg"][:1].lower() + err["msg"][1:])
        if kind.startswith("int") and _positive_int(schema, loc):
            text = "expected a positive integer"
        problems.append(f"{path}: {text}, got {json.dumps(err.get('input'), default=str)}")
    return problems


def _is_union_tag(part: str) -> bool:
    # pydantic inserts the member's type into the location of union errors
    return part[:1].isupper() or part in {"function-after", "function-before", "constrained-int"}


def _section_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_model(arg)
        if found is not None:
            return found
    return None


def _model_at(schema: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = schema
    for part in path:
        if model is None or part not in model.model_fields:
            return None
        model = _section_model(model.model_fields[part].annotation)
    return model


def _did_you_mean(schema: type[BaseModel], parent: Sequence[str], key: str) -> str:
    model = _model_at(schema, parent)
    if model is None:
        return ""
    close = difflib.get_close_matches(key, list(model.model_fields), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _positive_int(schema: type[BaseModel], loc: Sequence[str]) -> bool:
    model = _model_at(schema, loc[:-1])
    if model is None or loc[-1] not in model.model_fields:
        return False
    return any(getattr(m, "gt", None) == 0 for m in model.model_fields[loc[-1]].metadata)
