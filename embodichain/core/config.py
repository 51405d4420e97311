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
import types
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


class _RecipeLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would silently keep the last one."""


def _construct_mapping(loader: _RecipeLoader, node: yaml.MappingNode, deep: bool = False
                       ) -> dict[Any, Any]:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # unhashable key: let the base constructor report it
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                f"while reading a mapping (line {first.line + 1}, column {first.column + 1})",
                first, f"duplicate key {key!r} (already defined at line {first.line + 1})",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_RecipeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`YAML syntax error at line L, column C: what (context)` from a PyYAML error."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return f"YAML error: {exc}"
    mark = exc.problem_mark or exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
    text = f"YAML syntax error at {where}: {exc.problem or exc.context}"
    ctx = exc.context_mark
    if exc.context and exc.problem and ctx is not None and ctx is not mark:
        # e.g. an unclosed `{` is only noticed where the file ends; say where it opened
        if " (line " in exc.context:
            text += f" ({exc.context})"
        else:
            text += f" ({exc.context} that starts at line {ctx.line + 1}, column {ctx.column + 1})"
    return text


def read_recipe_file(path: str | Path) -> dict[str, Any]:
    """Parse a recipe file into a mapping, with line and column on YAML syntax errors."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        where = "" if path.is_absolute() else f" (looked for {Path.cwd() / path})"
        raise ConfigError([f"file not found{where}"], str(path)) from None
    except IsADirectoryError:
        raise ConfigError(["is a directory, not a recipe file"], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"not a text file ({exc.reason} at byte {exc.start})"], str(path)) \
            from None
    except OSError as exc:
        raise ConfigError([f"cannot read the file: {exc.strerror}"], str(path)) from None
    try:
        data = yaml.load(text, Loader=_RecipeLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc)], str(path)) from None
    if data is None:
        raise ConfigError(["the file is empty; expected a mapping with `factory`, `trainer`, ..."],
                          str(path))
    if not isinstance(data, dict):
        raise ConfigError([f"expected a mapping at the top level, got {type(data).__name__}"],
                          str(path))
    return data


@dataclass(frozen=True)
class Override:
    """One `--set KEY=VALUE`: the dotted key and the value's text as typed."""

    key: tuple[str, ...]
    text: str

    @property
    def dotted(self) -> str:
        return ".".join(self.key)


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Split `KEY=VALUE` items; raises ConfigError naming every malformed one."""
    parsed, problems = _parse_overrides(overrides)
    if problems:
        raise ConfigError(problems)
    return parsed


def _parse_overrides(overrides: Sequence[str]) -> tuple[list[Override], list[str]]:
    parsed, problems = [], []
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = tuple(p.strip() for p in key.strip().split("."))
        if not sep or not all(parts):
            problems.append(f"--set {item!r}: expected KEY=VALUE with a dotted key, "
                            "e.g. --set optimizer.lr=0.01")
            continue
        parsed.append(Override(parts, text))
    return parsed, problems


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str],
                    schema: type[BaseModel] | None = None) -> dict[str, Any]:
    """Apply `key.path=value` overrides to a copy of `raw`.

    Values are typed by `schema` (R-CFG-3): a text field (str, path, string choice) takes the
    text verbatim, so `--set trainer.output_dir=2024` stays a string; anything else is read
    as a YAML value (`64` -> int, `1.0e-3` -> float, `[1, 2]` -> list, `null`), which the
    schema then validates. A missing or null section on the way is created. Raises
    ConfigError naming every override that cannot be applied.
    """
    result = json.loads(json.dumps(raw, default=str))  # deep copy of plain data
    parsed, problems = _parse_overrides(overrides)
    for override in parsed:
        node = result
        parts = override.key
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(f"--set {override.dotted}: {'.'.join(parts[: depth + 1])} is "
                                f"not a section (it holds {json.dumps(child, default=str)})")
                break
            node = child
        else:
            node[parts[-1]] = _typed_value(override, schema)
    if problems:
        raise ConfigError(problems)
    return result


def _typed_value(override: Override, schema: type[BaseModel] | None) -> Any:
    text = override.text
    annotation = _annotation_at(schema, override.key) if schema is not None else None
    if annotation is not None and _is_text(annotation):
        if text.strip() in ("null", "~") and _allows_none(annotation):
            return None
        return text
    if not text.strip():
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # the schema will say what it expected


def load_recipe(path: str | Path, overrides: Sequence[str] = ()) -> Recipe:
    """Read, override and validate a recipe file; raises ConfigError listing every problem."""
    return validate_recipe(read_recipe_file(path), source=str(path), overrides=overrides)


def validate_recipe(raw: Mapping[str, Any], source: str | None = None,
                    overrides: Sequence[str] = ()) -> Recipe:
    """Validate a recipe mapping (after `overrides`) against the framework and factory schema."""
    checked = check_recipe(raw, source, overrides)
    if checked.recipe is None:
        raise ConfigError(checked.problems, source)
    return checked.recipe


@dataclass(frozen=True)
class RecipeCheck:
    """The outcome of validating a recipe: the recipe, or every problem found."""

    recipe: Recipe | None
    problems: list[str]
    raw: dict[str, Any]
    """The mapping after overrides (typed by the schema as far as it is known)."""
    factory_problem: str | None = None
    """Why the factory could not be loaded, if that is (one of) the problems."""


def check_recipe(raw: Mapping[str, Any], source: str | None = None,
                 overrides: Sequence[str] = ()) -> RecipeCheck:
    """Validate without raising for recipe problems (malformed `--set` items still raise)."""
    from embodichain.plugins.discovery import FactoryError, resolve_factory

    problems: list[str] = []
    factory = None
    factory_problem = None
    # `--set factory=...` may change the factory, which decides the schema of the rest.
    try:
        factory_ref = apply_overrides(raw, overrides).get("factory")
    except ConfigError as exc:
        raise ConfigError(exc.problems, source) from None
    if factory_ref is None:
        pass  # reported by the schema as a missing key
    elif not isinstance(factory_ref, str):
        factory_problem = f"expected a name or 'module:attribute', got {factory_ref!r}"
    else:
        try:
            factory = resolve_factory(factory_ref)
        except FactoryError as exc:
            factory_problem = str(exc)
    schema: type[BaseModel] = FrameworkConfig
    if factory is not None:
        try:
            schema = combined_schema(getattr(factory, "config_schema", None))
        except TypeError as exc:
            factory_problem = f"factory '{factory_ref}' is unusable: {exc}"
            factory = None
    if factory_problem is not None:
        problems.append(f"factory: {factory_problem}")
    raw = apply_overrides(raw, overrides, schema)

    if factory is None:
        # Still check the framework's own sections, so that every problem shows at once.
        framework_part = {k: v for k, v in raw.items() if k in FrameworkConfig.model_fields}
        problems += _validation_problems(FrameworkConfig, framework_part)
    else:
        try:
            config = schema.model_validate(raw)
        except ValidationError as exc:
            problems += format_validation_error(exc, schema)
        else:
            recipe = Recipe(config=config, factory=factory, source=source)
            return RecipeCheck(recipe, [], raw)
    problems = _mark_overrides(_dedupe(problems), _parse_overrides(overrides)[0])
    return RecipeCheck(None, problems, raw, factory_problem)


def resolve_framework_part(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe with only the framework's sections validated and defaulted.

    For when the factory is not importable (e.g. inspecting a checkpoint elsewhere): the
    recipe-owned sections are returned as written. Raises ConfigError on framework problems.
    """
    framework_part = {k: v for k, v in raw.items() if k in FrameworkConfig.model_fields}
    try:
        config = FrameworkConfig.model_validate(framework_part)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, FrameworkConfig)) from None
    rest = {k: v for k, v in raw.items() if k not in FrameworkConfig.model_fields}
    return {**resolved_dict(config), **json.loads(json.dumps(rest, default=str))}


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


def _mark_overrides(problems: list[str], overrides: Sequence[Override]) -> list[str]:
    """Say which problems come from a `--set`, since the file itself may be fine."""
    marked = []
    for problem in problems:
        key, _, text = problem.partition(": ")
        for o in reversed(overrides):  # the last --set of a key wins
            # the key itself or below it, or an unknown section that the --set created
            if (key == o.dotted or key.startswith(o.dotted + ".")
                    or (text.startswith("unknown key") and o.dotted.startswith(key + "."))):
                problem += f" (from --set {o.dotted}={o.text})"
                break
        marked.append(problem)
    return marked


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
    errors = exc.errors()
    # A typo'd key shows as "unknown key" plus "required key missing" for the real name;
    # when the did-you-mean names that missing key, one line says it all.
    missing = {_clean_loc(err["loc"]) for err in errors if err["type"] in _MISSING}
    problems = []
    seen_locs: set[tuple[str, ...]] = set()
    absorbed: set[tuple[str, ...]] = set()
    for err in errors:
        loc = _clean_loc(err["loc"])
        if err["type"] not in _UNKNOWN or not loc:
            continue
        suggestion = _suggest(schema, loc[:-1], loc[-1])
        if suggestion is not None and (*loc[:-1], suggestion) in missing:
            absorbed.add((*loc[:-1], suggestion))
    for err in errors:
        loc = _clean_loc(err["loc"])
        kind = err["type"]
        # Union members produce one error each; the first one is enough for the user.
        if loc in seen_locs and kind not in _UNKNOWN:
            continue
        seen_locs.add(loc)
        path = ".".join(loc) or "(recipe)"
        ctx = err.get("ctx") or {}
        if kind in _UNKNOWN:
            suggestion = _suggest(schema, loc[:-1], loc[-1]) if loc else None
            if suggestion is None:
                problems.append(f"{path}: unknown key")
            elif (*loc[:-1], suggestion) in absorbed:
                problems.append(f"{path}: unknown key (did you mean '{suggestion}'? "
                                "that required key is missing)")
            else:
                problems.append(f"{path}: unknown key (did you mean '{suggestion}'?)")
            continue
        if kind in _MISSING:
            if loc not in absorbed:
                problems.append(f"{path}: required key is missing")
            continue
        if kind == "greater_than":
            text = ("expected a positive number" if ctx.get("gt") == 0
                    else f"expected a value greater than {ctx.get('gt')}")
            if ctx.get("gt") == 0 and _positive_int(schema, loc):
                text = "expected a positive integer"
        elif kind == "greater_than_equal":
            text = f"expected a value of at least {ctx.get('ge')}"
        elif kind == "less_than":
            text = f"expected a value less than {ctx.get('lt')}"
        elif kind == "less_than_equal":
            text = f"expected a value of at most {ctx.get('le')}"
        elif kind == "literal_error":
            text = f"expected one of {ctx.get('expected')}"
        elif kind in ("value_error", "assertion_error"):
            text = str(ctx.get("error", err["msg"]))
            problems.append(f"{path}: {text}")
            continue
        else:
            text = _TYPE_TEXT.get(kind, err["msg"][:1].lower() + err["msg"][1:])
        if kind.startswith("int") and _positive_int(schema, loc):
            text = "expected a positive integer"
        problems.append(f"{path}: {text}, got {json.dumps(err.get('input'), default=str)}")
    return problems


_UNKNOWN = {"extra_forbidden", "unexpected_keyword_argument"}  # models / dataclasses
_MISSING = {"missing", "missing_keyword_argument", "missing_argument"}


def _clean_loc(loc: Sequence[Any]) -> tuple[str, ...]:
    return tuple(str(p) for p in loc if not _is_union_tag(str(p)))


def _is_union_tag(part: str) -> bool:
    # pydantic inserts the member's type into the location of union errors
    return part[:1].isupper() or part in {"function-after", "function-before", "constrained-int"}


def _fields_of(annotation: Any) -> dict[str, Any] | None:
    """Field name -> annotation of a section type (pydantic model or dataclass), or None.

    Looks through `X | None` and similar wrappers to the first section type.
    """
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {name: f.annotation for name, f in annotation.model_fields.items()}
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        try:
            hints = typing.get_type_hints(annotation)
        except Exception:  # unresolvable forward references: no hints, no suggestion
            return None
        return {f.name: hints.get(f.name) for f in dataclasses.fields(annotation)}
    for arg in typing.get_args(annotation):
        found = _fields_of(arg)
        if found is not None:
            return found
    return None


def _fields_at(schema: type[BaseModel], path: Sequence[str]) -> dict[str, Any] | None:
    fields = _fields_of(schema)
    for part in path:
        if fields is None or part not in fields:
            return None
        fields = _fields_of(fields[part])
    return fields


def _annotation_at(schema: type[BaseModel], path: Sequence[str]) -> Any:
    fields = _fields_at(schema, path[:-1])
    return None if fields is None else fields.get(path[-1])


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_text(annotation: Any) -> bool:
    """A field whose value is text: str, a path, or a choice among strings."""
    annotation = _strip_annotated(annotation)
    if annotation in (str, Path) or (isinstance(annotation, type)
                                     and issubclass(annotation, str | Path)):
        return True
    if typing.get_origin(annotation) is Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return all(_is_text(a) for a in args)
    return False


def _allows_none(annotation: Any) -> bool:
    return type(None) in typing.get_args(_strip_annotated(annotation))


def _suggest(schema: type[BaseModel], parent: Sequence[str], key: str) -> str | None:
    fields = _fields_at(schema, parent)
    if not fields:
        return None
    close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
    return close[0] if close else None


def _positive_int(schema: type[BaseModel], loc: Sequence[str]) -> bool:
    """Whether the field at `loc` is a positive integer (`PositiveInt`, maybe optional)."""
    model = _fields_owner(schema, loc[:-1])
    if model is None or loc[-1] not in model.model_fields:
        return False
    field = model.model_fields[loc[-1]]
    if field.annotation is int and any(getattr(m, "gt", None) == 0 for m in field.metadata):
        return True
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            base, *meta = typing.get_args(arg)
            if base is int and any(getattr(m, "gt", None) == 0 for m in meta):
                return True
    return False


def _fields_owner(schema: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    """The pydantic model at `path`, if the section there is one."""
    model: Any = schema
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) \
                or part not in model.model_fields:
            return None
        model = _section_model(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _section_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _section_model(arg)
        if found is not None:
            return found
    return None
