"""Find recipe factories: entry points of group `embodichain.sl_factories`, or `module:attr`.

A plugin that fails to import is reported by name and never breaks discovery of the others.

A factory's module usually imports torch, which takes seconds. Checking a recipe only needs
the factory's schema, so a distribution may also register, under the same name in the group
`embodichain.sl_schemas`, the schema class from a module that does not import torch
(`name = "pkg.schema:Schema"`). Commands that only check (`validate-config`,
`list-factories`) then use it and leave the factory unimported; without one they import the
factory as before.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import importlib_metadata

from embodichain.core.errors import did_you_mean

ENTRY_POINT_GROUP = "embodichain.sl_factories"
SCHEMA_GROUP = "embodichain.sl_schemas"


class FactoryError(Exception):
    """A factory reference that cannot be resolved; the message says why."""


@dataclass(frozen=True)
class FactoryInfo:
    """One registered factory, as `list-factories` shows it."""

    name: str
    target: str
    distribution: str | None
    version: str | None
    error: str | None = None  # import problem, if loading was attempted and failed
    schema_target: str | None = None  # `module:Class` registered in SCHEMA_GROUP, if any


class DeferredFactory:
    """A registered factory whose schema is loaded but whose module is not imported yet.

    Calling it imports the factory and calls it; `config_schema` is the registered schema.
    """

    def __init__(self, info: FactoryInfo, config_schema: Any) -> None:
        self.info = info
        self.config_schema = config_schema

    def load(self) -> Callable[..., Any]:
        return _load_target(self.info.target, origin=_origin(self.info))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


def _entry_points(group: str) -> list[tuple[str, str, str | None, str | None]]:
    """(name, target, distribution, version) of each entry point of `group`."""
    found = []
    for ep in importlib_metadata.entry_points(group=group):
        dist = ep.dist
        name = version = None
        if dist is not None:
            try:  # damaged metadata must not hide the other plugins
                name, version = dist.metadata["Name"], dist.version
            except Exception:
                pass
        found.append((ep.name, ep.value, name, version))
    return found


def registered_factories() -> list[FactoryInfo]:
    """Every entry point of the factory group, without importing any of them."""
    # A schema counts only from the distribution that registers the factory itself.
    schemas = {(name, dist): target for name, target, dist, _ in _entry_points(SCHEMA_GROUP)}
    infos = [FactoryInfo(name=name, target=target, distribution=dist, version=version,
                         schema_target=schemas.get((name, dist)))
             for name, target, dist, version in _entry_points(ENTRY_POINT_GROUP)]
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def check_factory(info: FactoryInfo, import_factory: bool = False) -> FactoryInfo:
    """The same entry with `error` set if its target does not import or is not a factory.

    With a registered schema (and not `import_factory`), the schema is imported and checked
    and the factory's module only located, not imported (no torch).
    """
    try:
        factory = (_deferred(info) if info.schema_target and not import_factory
                   else _load_target(info.target, origin=_origin(info)))
        _check_schema(factory, info.target)
    except FactoryError as exc:
        return FactoryInfo(info.name, info.target, info.distribution, info.version, str(exc),
                           info.schema_target)
    return info


def _deferred(info: FactoryInfo) -> DeferredFactory:
    """The factory of `info` with its registered schema, its module located but not run."""
    schema = _load_object(info.schema_target or "", f"schema of {_origin(info)}")
    module_name = info.target.partition(":")[0].strip()
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):  # a parent package is missing or broken
        found = False
    if not found:
        # Import it for real: the error then says what exactly is missing.
        _load_target(info.target, origin=_origin(info))
    return DeferredFactory(info, schema)


def _check_schema(factory: Any, target: str) -> None:
    """A `config_schema`, if any, must be one the recipe validation can combine."""
    from embodichain.core.recipe.schema import combined_schema

    try:
        combined_schema(getattr(factory, "config_schema", None))
    except TypeError as exc:
        raise FactoryError(f"'{target}': {exc}") from None


def resolve_factory(reference: str, import_factory: bool = True) -> Callable[..., Any]:
    """Load a factory from an entry-point name (`sl_ddp`) or a `module.path:attribute` string.

    Without `import_factory`, a factory with a registered schema comes back as a
    `DeferredFactory` (enough to validate a recipe, imported when called).
    """
    reference = reference.strip()
    if ":" in reference:
        if not import_factory:
            # `module:attr` of a registered factory: its registered schema serves as well.
            for info in registered_factories():
                if info.schema_target and info.target.replace(" ", "") == reference:
                    return _deferred(info)
        return _load_target(reference, origin=None)
    registered = registered_factories()
    matches = [info for info in registered if info.name == reference]
    if not matches:
        names = sorted({info.name for info in registered})
        hint = did_you_mean(reference, names)
        raise FactoryError(
            f"no factory named '{reference}' in entry-point group '{ENTRY_POINT_GROUP}' "
            f"({hint}registered: {', '.join(names) or 'none'}); use a registered name or "
            "'module.path:attribute'"
        )
    if len(matches) > 1:
        owners = ", ".join(_origin(m) for m in matches)
        raise FactoryError(f"factory name '{reference}' is registered more than once ({owners})")
    if matches[0].schema_target and not import_factory:
        return _deferred(matches[0])
    return _load_target(matches[0].target, origin=_origin(matches[0]))


def _origin(info: FactoryInfo) -> str:
    if info.distribution is None:
        return f"entry point '{info.name}'"
    return f"entry point '{info.name}' of distribution {info.distribution} {info.version}"


def _distribution_of(module_name: str) -> str | None:
    """`distribution X.Y` that installs `module_name`'s top-level package, if known."""
    top = module_name.split(".")[0]
    try:
        names = importlib_metadata.packages_distributions().get(top, [])
        return ", ".join(f"distribution {n} {importlib_metadata.version(n)}" for n in names) \
            or None
    except Exception:  # best effort: only used to word an error message
        return None


def _load_target(target: str, origin: str | None) -> Callable[..., Any]:
    obj = _load_object(target, origin)
    if not callable(obj):
        where = f" ({origin})" if origin else ""
        raise FactoryError(f"'{target}'{where} is not callable")
    return obj


def _load_object(target: str, origin: str | None) -> Any:
    """The object that `module.path:attribute` names; FactoryError says why it cannot load."""
    module_name, _, attr_path = target.strip().partition(":")
    where = f" ({origin})" if origin else ""
    if not module_name or not attr_path:
        raise FactoryError(f"'{target}' is not of the form 'module.path:attribute'{where}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise FactoryError(f"cannot import module '{module_name}'{where}: "
                               f"no module named '{exc.name}'") from None
        # The module exists but needs something that is not installed.
        where = where or (f" ({owner})" if (owner := _distribution_of(module_name)) else "")
        raise FactoryError(f"importing '{module_name}'{where} failed: {exc}") from None
    except (Exception, SystemExit) as exc:  # a plugin may raise anything; never crash
        where = where or (f" ({owner})" if (owner := _distribution_of(module_name)) else "")
        raise FactoryError(
            f"importing '{module_name}'{where} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise FactoryError(f"module '{module_name}' has no attribute '{attr_path}'{where}") \
                from None
    return obj
