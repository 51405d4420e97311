"""Readable recipe errors: pydantic's validation errors as `key.path: expected ..., got ...`
lines, with did-you-mean for unknown keys (R-CFG-5)."""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

_TYPE_TEXT = {
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
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
            pieces = text.split("; ")
            # A section's validator names its keys itself (`optimizer.betas: ...`): not
            # `optimizer: optimizer.betas: ...`, nor `(recipe): trainer.precision: ...`.
            if all(_names_a_key_within(piece, loc) for piece in pieces):
                problems.extend(pieces)
            elif _names_a_key_within(text, loc):
                problems.append(text)
            else:
                problems.append(f"{path}: {text}")
            continue
        elif kind in ("too_short", "too_long"):
            bound = ctx.get("min_length") if kind == "too_short" else ctx.get("max_length")
            text = (f"expected {'at least' if kind == 'too_short' else 'at most'} {bound} "
                    f"item{'s' if bound != 1 else ''}")
        else:
            text = _TYPE_TEXT.get(kind, err["msg"][:1].lower() + err["msg"][1:])
        if kind.startswith("int") and _positive_int(schema, loc):
            text = "expected a positive integer"
        value = err.get("input")
        problems.append(f"{path}: {text}, got {shown(value)}"
                        + (_number_text_hint(value) if kind.startswith(("int", "float")) else ""))
    return problems


def _names_a_key_within(text: str, loc: tuple[str, ...]) -> bool:
    """Whether `text` starts with `key.path: ` for a key at or below `loc`."""
    head, sep, _ = text.partition(": ")
    if not sep or not head or " " in head:
        return False
    where = ".".join(loc)
    return not where or head == where or head.startswith(where + ".")


def shown(value: Any) -> str:
    """A recipe value as the user wrote it: JSON, but YAML's `.inf` / `.nan` spellings."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value, default=str)


def _number_text_hint(value: Any) -> str:
    """Why a number arrived as text: YAML 1.1 reads `1e18` (no dot) as a string."""
    if not isinstance(value, str):
        return ""
    try:
        number = decimal.Decimal(value.strip())
    except decimal.InvalidOperation:
        return ""
    if not number.is_finite():
        return ""
    if number == number.to_integral_value():
        return (f" (YAML reads {value} as text, not a number; write the integer in full: "
                f"{int(number)})")
    mantissa, _, exponent = value.strip().lower().partition("e")
    if exponent and "." not in mantissa:  # 1e-3: YAML wants a dot in the mantissa
        return f" (YAML reads {value} as text, not a number; write {mantissa}.0e{exponent})"
    return ""


def strict_value_problems(schema: type[BaseModel], raw: Mapping[str, Any]) -> list[str]:
    """What every schema refuses, whatever its own strictness: `true`/`false` where a number
    is expected (pydantic's lax mode would take it as 1/0) and non-finite numbers anywhere.
    """
    problems: list[str] = []
    _walk_values(raw, schema, (), problems, schema)
    return problems


def _walk_values(value: Any, annotation: Any, loc: tuple[str, ...], problems: list[str],
                 schema: type[BaseModel]) -> None:
    path = ".".join(loc) or "(recipe)"
    if isinstance(value, bool):
        if annotation is not None and _is_number_type(annotation):
            text = ("expected a positive integer" if _positive_int(schema, loc)
                    else "expected an integer" if _is_number_type(annotation, (int,))
                    else "expected a number")
            problems.append(f"{path}: {text}, got {shown(value)} (a boolean is not a number)")
    elif isinstance(value, float) and not math.isfinite(value):
        problems.append(f"{path}: expected a finite number, got {shown(value)}")
    elif isinstance(value, Mapping):
        fields = _fields_of(annotation) if annotation is not None else None
        for key, item in value.items():
            _walk_values(item, (fields or {}).get(key), (*loc, str(key)), problems, schema)
    elif isinstance(value, list | tuple):
        item_type = _item_type(annotation)
        for i, item in enumerate(value):
            _walk_values(item, item_type, (*loc, str(i)), problems, schema)


def _is_number_type(annotation: Any, kinds: tuple[type, ...] = (int, float)) -> bool:
    """int / float (constrained or optional), and no bool or other type among the choices."""
    annotation = _strip_annotated(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and all(_is_number_type(a, kinds) for a in args)
    return (isinstance(annotation, type) and issubclass(annotation, kinds)
            and not issubclass(annotation, bool))


def _item_type(annotation: Any) -> Any:
    annotation = _strip_annotated(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = _strip_annotated(args[0]) if len(args) == 1 else None
    if typing.get_origin(annotation) in (list, tuple, set, frozenset, Sequence):
        args = typing.get_args(annotation)
        return args[0] if args else None
    return None


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
    """The fields of the section at `path`; a number steps into a list's item type (the
    sections of `data.mixture.1`)."""
    annotation: Any = schema
    for part in path:
        if str(part).isdigit() and (item := _item_type(annotation)) is not None:
            annotation = item
            continue
        fields = _fields_of(annotation)
        if fields is None or part not in fields:
            return None
        annotation = fields[part]
    return _fields_of(annotation)


def annotation_at(schema: type[BaseModel], path: Sequence[str]) -> Any:
    fields = _fields_at(schema, path[:-1])
    return None if fields is None else fields.get(path[-1])


def _strip_annotated(annotation: Any) -> Any:
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def is_text(annotation: Any) -> bool:
    """A field whose value is text: str, a path, or a choice among strings."""
    annotation = _strip_annotated(annotation)
    if annotation in (str, Path) or (isinstance(annotation, type)
                                     and issubclass(annotation, str | Path)):
        return True
    if typing.get_origin(annotation) is Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args:
        return all(is_text(a) for a in args)
    return False


def allows_none(annotation: Any) -> bool:
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
