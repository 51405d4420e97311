"""Which recipe differences forbid resuming a checkpoint (R-RESUME-2). Torch-free.

A key may differ when it changes only how a run is shown, checked or saved
(`RESUMABLE_CHANGES`). A key the checkpoint's stored recipe lacks (the schema grew after the
checkpoint was written) is no difference when this run's value is the schema's default (the
framework's schema, or the factory's `config_schema`, read off the schema itself): a schema
author gives a new key the default that reproduces the old behaviour. A key the checkpoint
has and this run lacks (renamed or removed) is always a difference. A field that only says
where the data lies (`LOCATES_DATA`: a dataset root) may differ when the source's identity is
unchanged: the data moved (R-PREEMPT-3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from embodichain.core.recipe.best import patience_problems
from embodichain.core.recipe.data_location import moved_locations, with_values
from embodichain.core.recipe.schema import (
    NO_DEFAULT,
    FrameworkConfig,
    default_at,
    flatten_keys,
    is_resumable_change,
)
from embodichain.core.runs.elastic import ELASTIC_KEYS, continues_on_any_world_size

ABSENT = "<absent>"


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any], step: int,
                       schema: type[BaseModel] | None = None, same_source: bool = False
                       ) -> list[str]:
    """Each recipe difference that forbids resuming, with both values. `schema`: the
    recipe's schema (the combined one of its factory; None: the framework's alone), whose
    defaults decide the keys `saved` lacks: such a key compares as its default (what the
    checkpoint was trained with); a section it lacks as a whole, key by key as absent.
    Under the same global batch size the micro-batch and its count may change (elastic.py).
    `same_source`: the source identity is the checkpoint's, so data that moved (`moved`) is
    no difference."""
    if same_source:
        saved = with_values(saved, {k: new for k, (_, new) in moved(saved, current,
                                                                   schema).items()})
    old, new = flatten_keys(saved), flatten_keys(current)
    newer = newer_keys(saved, current, schema)
    elastic = ELASTIC_KEYS if continues_on_any_world_size(saved, current) else ()
    problems = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        if a == b or is_resumable_change(key) or key in elastic:
            continue
        prefix = _absent_prefix(saved, key)
        if prefix in newer:
            default, value = newer[prefix]
            if value == default:
                continue
            if prefix == key and default is not NO_DEFAULT:
                a = default  # what the checkpoint was trained with, the key not yet there
        problems += _described(key, a, b)
    problems += patience_problems(old, new)
    max_updates = new.get("trainer.max_updates")
    if isinstance(max_updates, int) and max_updates < step:
        problems.append(f"trainer.max_updates: {max_updates} is below the checkpoint's "
                        f"update {step}")
    return problems


def moved(saved: Mapping[str, Any], current: Mapping[str, Any],
          schema: type[BaseModel] | None = None) -> dict[str, tuple[Any, Any]]:
    """The data locations (fields marked LOCATES_DATA) that differ: `{key: (old, new)}`."""
    return moved_locations(saved, current, schema or FrameworkConfig)


def _described(key: str, a: Any, b: Any) -> list[str]:
    """One difference, with both values; lists of sections (`data.mixture`) item by item,
    naming the index and field (`data.mixture.1.weight: checkpoint 1.0, this run 2.0`),
    not both whole lists."""
    if not (isinstance(a, list) and isinstance(b, list)
            and all(isinstance(item, Mapping) for item in [*a, *b])):
        return [f"{key}: checkpoint {a!r}, this run {b!r}"]
    found = []
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b):
            which, item = ("this run", b[i]) if i >= len(a) else ("the checkpoint", a[i])
            found.append(f"{key}.{i}: only {which} has it ({item!r}; the checkpoint has "
                         f"{len(a)} item(s), this run {len(b)})")
            continue
        old, new = flatten_keys(a[i]), flatten_keys(b[i])
        found += [f"{key}.{i}.{field}: checkpoint {old.get(field, ABSENT)!r}, this run "
                  f"{new.get(field, ABSENT)!r}" for field in sorted(set(old) | set(new))
                  if old.get(field, ABSENT) != new.get(field, ABSENT)]
    return found


def newer_keys(saved: Mapping[str, Any], current: Mapping[str, Any],
               schema: type[BaseModel] | None = None) -> dict[str, tuple[Any, Any]]:
    """The outermost keys of `current` that `saved` lacks: `{key: (schema default or
    NO_DEFAULT, this run's value)}`."""
    found: dict[str, tuple[Any, Any]] = {}
    for key in flatten_keys(current):
        prefix = _absent_prefix(saved, key)
        if prefix is not None and prefix not in found:
            found[prefix] = (default_at(schema or FrameworkConfig, prefix),
                             _value_at(current, prefix))
    return found


def keys_at_default(saved: Mapping[str, Any], current: Mapping[str, Any],
                    schema: type[BaseModel] | None = None) -> dict[str, Any]:
    """The keys `saved` lacks that this run has at their default: `{key: value}`, what a
    resume adds to the stored recipe so that it records them."""
    return {key: value for key, (default, value) in newer_keys(saved, current, schema).items()
            if value == default}


def with_keys(config: Mapping[str, Any], added: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the nested `config` with each dotted key of `added` set."""
    result = _copy(config)
    for dotted, value in added.items():
        *parents, leaf = dotted.split(".")
        node = result
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return result


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _absent_prefix(saved: Mapping[str, Any], key: str) -> str | None:
    """The shortest prefix of the dotted `key` that `saved` lacks, or None: present, or
    below a value that is no section (`trainer.ema: null` saved, `trainer.ema.decay` now)."""
    node: Any = saved
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping):
            return None
        if part not in node:
            return ".".join(parts[:i + 1])
        node = node[part]
    return None


def _value_at(data: Mapping[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        node = node[part]
    return node
