"""Shell completion for recipe names, `--set` keys and paths (`--install-completion`).

Typer's completion scripts drop click's "complete a file here" hint, so paths are completed
here too. Everything is torch-free and never fails: a completion that cannot be computed is
an empty one.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

RECIPE_SUFFIXES = (".yaml", ".yml")


def recipe_names(incomplete: str) -> list[str]:
    """The packaged recipes `init` can copy."""
    try:
        from embodichain.core.recipe.packaged import registered_recipes

        return [r.name for r in registered_recipes() if r.name.startswith(incomplete)]
    except Exception:
        return []


def paths(incomplete: str, suffixes: tuple[str, ...] = (), directories_only: bool = False
          ) -> list[str]:
    """Entries of the directory being typed: directories (with `/`), files with `suffixes`."""
    try:
        base = Path(incomplete).expanduser()
        parent, stem = (base, "") if incomplete.endswith("/") else (base.parent, base.name)
        prefix = incomplete[:len(incomplete) - len(stem)]
        found = []
        for entry in sorted(parent.iterdir()):
            if not entry.name.startswith(stem) or (entry.name.startswith(".")
                                                    and not stem.startswith(".")):
                continue
            if entry.is_dir():
                found.append(f"{prefix}{entry.name}/")
            elif not directories_only and (not suffixes or entry.suffix in suffixes):
                found.append(f"{prefix}{entry.name}")
        return found
    except OSError:
        return []


def recipe_files(incomplete: str) -> list[str]:
    return paths(incomplete, RECIPE_SUFFIXES)


def checkpoints(incomplete: str) -> list[str]:
    return paths(incomplete, (".pt",))


def any_path(incomplete: str) -> list[str]:
    return paths(incomplete)


def run_directories(incomplete: str) -> list[str]:
    return paths(incomplete, directories_only=True)


def set_keys(ctx: typer.Context, args: list[str], incomplete: str) -> list[str]:
    """`KEY=` for every key of the framework's sections, and of the factory's sections when
    the recipe given (`--config` / CONFIG) names a factory with a torch-free schema."""
    try:
        from embodichain.core.recipe.schema import FrameworkConfig

        schema: Any = FrameworkConfig
        # A positional CONFIG is not parsed yet while an option's value is completed: the
        # words typed so far (bash: COMP_WORDS, zsh / fish: _TYPER_COMPLETE_ARGS) name it.
        typed = [*args, *" ".join(os.environ.get(v, "") for v in
                                  ("COMP_WORDS", "_TYPER_COMPLETE_ARGS")).split()]
        recipe = (ctx.params or {}).get("config") or next(
            (a for a in typed if a.endswith(RECIPE_SUFFIXES) and Path(a).is_file()), None)
        if recipe:
            schema = _recipe_schema(Path(recipe)) or schema
        keys = sorted(set(_keys(schema)))
        return [f"{k}=" for k in keys if k.startswith(incomplete)]
    except Exception:
        return []


def _recipe_schema(path: Path) -> Any:
    from embodichain.core.recipe.discovery import resolve_factory
    from embodichain.core.recipe.loading import read_recipe_file
    from embodichain.core.recipe.schema import combined_schema

    factory = read_recipe_file(path).get("factory")
    if not isinstance(factory, str):
        return None
    resolved = resolve_factory(factory, import_factory=False)
    return combined_schema(getattr(resolved, "config_schema", None))


def _keys(model: Any, prefix: str = "") -> Iterator[str]:
    from pydantic import BaseModel

    for name, field in getattr(model, "model_fields", {}).items():
        section = _model_in(field.annotation, BaseModel)
        if section is not None:
            yield from _keys(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def _model_in(annotation: Any, base: type) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, base):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg, base)
        if found is not None:
            return found
    return None
