"""Recipes from YAML: loading, `--set` overrides and validation (R-CFG-2..5).

Every problem is collected and reported at once, each with its key path.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from embodichain.core.errors import ConfigError
from embodichain.core.recipe.consistency import recipe_problems, recipe_warnings
from embodichain.core.recipe.global_batch import global_batch_problem
from embodichain.core.recipe.limits import framework_limit_problems
from embodichain.core.recipe.schema import FrameworkConfig, combined_schema, resolved_dict
from embodichain.core.recipe.validation_errors import (
    allows_none,
    annotation_at,
    format_validation_error,
    is_text,
    strict_value_problems,
)


@dataclass(frozen=True)
class Recipe:
    """A validated recipe: the typed config and the factory that builds its trainer."""

    config: FrameworkConfig
    factory: Callable[..., Any]
    source: str | None = None
    warnings: tuple[str, ...] = ()
    """Keys whose value has no effect in this recipe (recipe/consistency.py)."""

    @property
    def resolved(self) -> dict[str, Any]:
        return resolved_dict(self.config)


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
        node: Any = result
        parts = override.key
        for depth, part in enumerate(parts):
            where = ".".join(parts[:depth])
            if isinstance(node, list):  # a list of sections: `data.mixture.1.weight`
                if not part.isdigit() or int(part) >= len(node):
                    problems.append(f"--set {override.dotted}: {where} is a list of "
                                    f"{len(node)} item(s); name one by its index 0.."
                                    f"{len(node) - 1}, e.g. --set {where}.0.{parts[-1]}=...")
                    break
                part = int(part)
            elif not isinstance(node, dict):
                problems.append(f"--set {override.dotted}: {where} is not a section (it holds "
                                f"{json.dumps(node, default=str)})")
                break
            if depth == len(parts) - 1:
                node[part] = _typed_value(override, schema)
            elif isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[part]
    if problems:
        raise ConfigError(problems)
    return result


def _typed_value(override: Override, schema: type[BaseModel] | None) -> Any:
    text = override.text
    annotation = annotation_at(schema, override.key) if schema is not None else None
    if annotation is not None and is_text(annotation):
        if text.strip() in ("null", "~") and allows_none(annotation):
            return None
        return text
    if not text.strip():
        return text
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text  # the schema will say what it expected


def load_recipe(path: str | Path, overrides: Sequence[str] = (), import_factory: bool = True
                ) -> Recipe:
    """Read, override and validate a recipe file; raises ConfigError listing every problem.

    `import_factory=False`: a factory with a torch-free registered schema is not imported
    (its `Recipe.factory` imports it when called); for commands that only check.
    """
    return validate_recipe(read_recipe_file(path), source=str(path), overrides=overrides,
                           import_factory=import_factory)


def validate_recipe(raw: Mapping[str, Any], source: str | None = None,
                    overrides: Sequence[str] = (), import_factory: bool = True) -> Recipe:
    """Validate a recipe mapping (after `overrides`) against the framework and factory schema."""
    checked = check_recipe(raw, source, overrides, import_factory=import_factory)
    if checked.recipe is None:
        raise ConfigError(checked.problems, source)
    return checked.recipe


def for_world_size(recipe: Recipe, world_size: int) -> Recipe:
    """The recipe as `world_size` ranks run it: under `trainer.global_batch_size` with its
    `grad_accumulation` derived (R-ELASTIC-1). ConfigError (exit 2) naming G, the world size
    and the batch size when they do not divide, before anything starts."""
    t = recipe.config.trainer
    if t.global_batch_size is None:
        return recipe
    problem = global_batch_problem(t, world_size)
    if problem:
        raise ConfigError([f"{problem}. Nothing was started"], recipe.source)
    k = t.global_batch_size // (world_size * t.batch_size)
    trainer = t.model_copy(update={"grad_accumulation": k})
    return dataclasses.replace(recipe, config=recipe.config.model_copy(update={"trainer": trainer}))


def known_world_size(local_ranks: int | None) -> int | None:
    """The world size a recipe is checked for: torchrun's WORLD_SIZE, else the ranks this
    node starts (`--nproc-per-node`; None: not known)."""
    env = os.environ.get("WORLD_SIZE")
    return int(env) if env else local_ranks


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
                 overrides: Sequence[str] = (), import_factory: bool = True) -> RecipeCheck:
    """Validate without raising for recipe problems (malformed `--set` items still raise)."""
    from embodichain.core.recipe.discovery import FactoryError, resolve_factory

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
            factory = resolve_factory(factory_ref, import_factory=import_factory)
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

    strict = strict_value_problems(schema, raw) + framework_limit_problems(raw)
    if factory is not None and getattr(factory, "config_schema", None) is None:
        strict += _no_schema_problems(raw, str(factory_ref))
    if factory is None:
        # Still check the framework's own sections, so that every problem shows at once.
        framework_part = {k: v for k, v in raw.items() if k in FrameworkConfig.model_fields}
        problems += strict + _without_keys(_validation_problems(FrameworkConfig, framework_part),
                                           strict)
    else:
        try:
            config = schema.model_validate(raw)
        except ValidationError as exc:
            problems += strict + _without_keys(format_validation_error(exc, schema), strict)
        else:
            strict += recipe_problems(config)  # keys that need each other
            if not strict:
                recipe = Recipe(config=config, factory=factory, source=source,
                                warnings=tuple(recipe_warnings(config)))
                return RecipeCheck(recipe, [], raw)
            problems += strict
    problems = _mark_overrides(_dedupe(problems), _parse_overrides(overrides)[0])
    return RecipeCheck(None, problems, raw, factory_problem)


def _no_schema_problems(raw: Mapping[str, Any], factory_ref: str) -> list[str]:
    """A section of the recipe's own for a factory that declares no schema: say that, not
    `model: unknown key` (which reads as a typo in the recipe)."""
    return [f"{key}: factory '{factory_ref}' has no config_schema, so it takes no `{key}` "
            "section; declare the factory's sections (`build_supervised_trainer.config_schema "
            "= MyRecipe`, a Section or dataclass: see docs/factories.md)"
            for key in raw if key not in FrameworkConfig.model_fields]


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


def _without_keys(problems: list[str], reported: list[str]) -> list[str]:
    """Drop problems about keys that `reported` already explains (one line per key)."""
    keys = {p.partition(": ")[0] for p in reported}
    return [p for p in problems if p.partition(": ")[0] not in keys]


def _dedupe(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _validation_problems(schema: type[BaseModel], raw: Mapping[str, Any]) -> list[str]:
    try:
        schema.model_validate(dict(raw))
    except ValidationError as exc:
        return format_validation_error(exc, schema)
    return []
