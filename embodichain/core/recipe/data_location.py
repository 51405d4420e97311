"""Recipe fields that only say where a source's data lies (R-PREEMPT-3).

A schema marks such a field `Annotated[Path, LOCATES_DATA]` (a dataset root, a mixture
part's root). When a resumed run's source identity equals the checkpoint's, the data is the
same wherever it now lies: a different value of such a field is no difference, only a move,
which the resume records (core/runs/config_compat.py).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel


class LocatesData:
    """The marker (use the instance `LOCATES_DATA` in `Annotated[...]`)."""

    def __repr__(self) -> str:
        return "LOCATES_DATA"


LOCATES_DATA = LocatesData()


def locates_data(schema: Any, dotted: str) -> bool:
    """Whether the dotted key (`data.root`, `data.mixture.1.root`: list items by index) is a
    field of `schema` (a pydantic model or dataclass, sections nested) marked LOCATES_DATA."""
    node: Any = schema
    marked = False
    for part in dotted.split("."):
        if part.isdigit():
            items = [typing.get_args(a)[0] for a in _alternatives(node)
                     if typing.get_origin(a) in (list, Sequence) and typing.get_args(a)]
            if len(items) != 1:
                return False
            node, marked = items[0], False
            continue
        sections = [a for a in _alternatives(node) if _is_section(a)]
        if len(sections) != 1:
            return False
        found = _field(sections[0], part)
        if found is None:
            return False
        node, metadata = found
        marked = any(m is LOCATES_DATA for m in metadata) or _marked(node)
    return marked


def moved_locations(saved: Any, current: Any, schema: Any, prefix: str = ""
                    ) -> dict[str, tuple[Any, Any]]:
    """The fields marked LOCATES_DATA whose values differ between the stored recipe `saved`
    and this run's `current`: `{dotted key: (old, new)}`, list items by index (lists of the
    same length only)."""
    found: dict[str, tuple[Any, Any]] = {}
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        pairs = [(str(k), saved[k], current[k]) for k in saved if k in current]
    elif isinstance(saved, list) and isinstance(current, list) and len(saved) == len(current):
        pairs = [(str(i), a, b) for i, (a, b) in enumerate(zip(saved, current, strict=True))]
    else:
        if saved != current and prefix and locates_data(schema, prefix):
            found[prefix] = (saved, current)
        return found
    for key, a, b in pairs:
        found.update(moved_locations(a, b, schema, f"{prefix}.{key}" if prefix else key))
    return found


def with_values(config: Any, values: Mapping[str, Any]) -> Any:
    """A copy of the nested `config` with each dotted key (list items by index) set, where
    `config` has it."""
    if not values:
        return config
    result = _copy(config)
    for dotted, value in values.items():
        *parents, leaf = dotted.split(".")
        node = result
        try:  # a key `config` lacks (another recipe's) is left out
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            if isinstance(node, list):
                node[int(leaf)] = value
            elif isinstance(node, dict):
                node[leaf] = value
        except (KeyError, IndexError, ValueError, TypeError):
            continue
    return result


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _alternatives(annotation: Any) -> list[Any]:
    """The types an annotation may hold: `Annotated` unwrapped, each arm of a union."""
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return [t for a in typing.get_args(annotation) for t in _alternatives(a)]
    return [annotation]


def _marked(annotation: Any) -> bool:
    """LOCATES_DATA in an `Annotated` of the annotation or of an arm of its union."""
    if typing.get_origin(annotation) is Annotated:
        if any(m is LOCATES_DATA for m in annotation.__metadata__):
            return True
        annotation = typing.get_args(annotation)[0]
    return any(_marked(a) for a in typing.get_args(annotation)
               if typing.get_origin(annotation) is not list)


def _is_section(node: Any) -> bool:
    return isinstance(node, type) and (issubclass(node, BaseModel)
                                       or dataclasses.is_dataclass(node))


def _field(section: Any, name: str) -> tuple[Any, list[Any]] | None:
    """A field's annotation (extras kept) and its pydantic metadata, or None."""
    if issubclass(section, BaseModel):
        field = section.model_fields.get(name)
        return None if field is None else (field.annotation, list(field.metadata))
    hints = typing.get_type_hints(section, include_extras=True)
    return (hints[name], []) if name in hints else None
