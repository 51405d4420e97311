"""Limits of the framework's own values beyond what their types say (R-CFG-5, design §9).

A YAML integer has no size limit, but the code that uses it does: torch takes 64-bit
integers, and a batch of 10^21 examples validates as a positive integer only to crash in
`torch.randint` with C++ frames. So every integer key of the framework's sections (those
added later included: the walk follows the schema) is refused beyond a 64-bit integer, and
a few keys have tighter limits, named below with the reason. An empty `trainer.output_dir`
is refused too: it would mean the current directory. Torch-free.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from embodichain.core.recipe.schema import FrameworkConfig

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

MAX_DATA_WORKERS = 1024
# Tighter upper limits: key -> (limit, why).
UPPER_LIMITS: dict[str, tuple[int, str]] = {
    # One batch's indices and examples are single tensors, and many kernels index with 32 bits.
    "trainer.batch_size": (2**31 - 1, "a per-worker batch is one tensor"),
    # Each is a process of its own: beyond the threads of the largest machines (a few
    # hundred), and a fork each at start-up. Lower, machine-dependent limits (processes,
    # memory) are in recipe/machine_limits.py.
    "trainer.data_workers": (MAX_DATA_WORKERS, "one process each, per rank"),
}
# An update draws all its `batch_size * grad_accumulation` indices as one tensor (R-LOOP-1).
MAX_DRAWN = 2**31 - 1


def framework_limit_problems(raw: Mapping[str, Any]) -> list[str]:
    """`key: expected ..., got VALUE` for each framework value the code cannot use."""
    problems: list[str] = []
    _walk(FrameworkConfig, raw, (), problems)
    trainer = raw.get("trainer")
    if isinstance(trainer, Mapping):
        drawn = [trainer.get(k, 1) for k in ("batch_size", "grad_accumulation")]
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= INT64_MAX
               for v in drawn) and drawn[0] * drawn[1] > MAX_DRAWN \
                and drawn[0] <= MAX_DRAWN:
            problems.append(f"trainer.grad_accumulation: expected batch_size x "
                            f"grad_accumulation at most {MAX_DRAWN} (the indices of one "
                            f"update are drawn at once, as one tensor), got {drawn[0]} x "
                            f"{drawn[1]} = {drawn[0] * drawn[1]}")
        output_dir = trainer.get("output_dir")
        if isinstance(output_dir, str) and not output_dir.strip():
            problems.append(f"trainer.output_dir: expected a directory path, got "
                            f"{output_dir!r} (an empty path would write the run into the "
                            "current directory)")
    return problems


def _walk(model: type[BaseModel], raw: Mapping[str, Any], loc: tuple[str, ...],
          problems: list[str]) -> None:
    for name, field in model.model_fields.items():
        if name not in raw:
            continue
        value, key = raw[name], ".".join((*loc, name))
        section = _section(field.annotation)
        if section is not None and isinstance(value, Mapping):
            _walk(section, value, (*loc, name), problems)
        elif _is_int(field.annotation) and isinstance(value, int) \
                and not isinstance(value, bool):
            problem = _int_problem(key, value)
            if problem is not None:
                problems.append(problem)


def _int_problem(key: str, value: int) -> str | None:
    limit, why = UPPER_LIMITS.get(key, (INT64_MAX, "a 64-bit integer, as torch takes"))
    if value > limit:
        return f"{key}: expected at most {limit} ({why}), got {value}"
    if value < INT64_MIN:
        return f"{key}: expected at least {INT64_MIN} (a 64-bit integer, as torch takes), " \
               f"got {value}"
    return None


def _strip(annotation: Any) -> list[Any]:
    """The types an annotation admits: through `Annotated`, `X | None` and unions."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _strip(arg)
                if t is not type(None)]
    return [annotation]


def _is_int(annotation: Any) -> bool:
    return any(isinstance(t, type) and issubclass(t, int) and not issubclass(t, bool)
               for t in _strip(annotation))


def _section(annotation: Any) -> type[BaseModel] | None:
    return next((t for t in _strip(annotation)
                 if isinstance(t, type) and issubclass(t, BaseModel)), None)
