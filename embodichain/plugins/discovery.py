"""Find recipe factories: entry points of group `embodichain.sl_factories`, or `module:attr`.

A plugin that fails to import is reported by name and never breaks discovery of the others.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import importlib_metadata

ENTRY_POINT_GROUP = "embodichain.sl_factories"


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


def registered_factories() -> list[FactoryInfo]:
    """Every entry point of the factory group, without importing any of them."""
    infos = []
    for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist
        name = version = None
        if dist is not None:
            try:  # damaged metadata must not hide the other plugins
                name, version = dist.metadata["Name"], dist.version
            except Exception:
                pass
        infos.append(FactoryInfo(name=ep.name, target=ep.value, distribution=name,
                                 version=version))
    return sorted(infos, key=lambda info: (info.name, info.distribution or ""))


def check_factory(info: FactoryInfo) -> FactoryInfo:
    """The same entry with `error` set if its target does not import or is not a factory."""
    try:
        _check_schema(_load_target(info.target, origin=_origin(info)), info.target)
    except FactoryError as exc:
        return FactoryInfo(info.name, info.target, info.distribution, info.version, str(exc))
    return info


def _check_schema(factory: Any, target: str) -> None:
    """A `config_schema`, if any, must be one the recipe validation can combine."""
    from embodichain.core.config import combined_schema

    try:
        combined_schema(getattr(factory, "config_schema", None))
    except TypeError as exc:
        raise FactoryError(f"'{target}': {exc}") from None


def resolve_factory(reference: str) -> Callable[..., Any]:
    """Load a factory from an entry-point name (`sl_ddp`) or a `module.path:attribute` string."""
    reference = reference.strip()
    if ":" in reference:
        return _load_target(reference, origin=None)
    registered = registered_factories()
    matches = [info for info in registered if info.name == reference]
    if not matches:
        names = sorted({info.name for info in registered})
        close = difflib.get_close_matches(reference, names, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise FactoryError(
            f"no factory named '{reference}' in entry-point group '{ENTRY_POINT_GROUP}' "
            f"({hint}registered: {', '.join(names) or 'none'}); use a registered name or "
            "'module.path:attribute'"
        )
    if len(matches) > 1:
        owners = ", ".join(_origin(m) for m in matches)
        raise FactoryError(f"factory name '{reference}' is registered more than once ({owners})")
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
    if not callable(obj):
        raise FactoryError(f"'{target}'{where} is not callable")
    return obj
