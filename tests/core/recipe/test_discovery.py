"""R-PLUG-1, R-CFG-2: factories come from entry points of `embodichain.sl_factories`, or from
`module.path:attribute` strings; a plugin that fails to import breaks nothing else.

The plugins here belong to a throwaway distribution: a `*.dist-info` directory (METADATA and
entry_points.txt) next to its modules in a temporary directory put on sys.path, exactly how an
installed wheel looks to importlib-metadata.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import embodichain
from embodichain.core.recipe.discovery import (
    FactoryError,
    FactoryInfo,
    check_factory,
    registered_factories,
    resolve_factory,
)
from tests.support import run_cli, worker_env

MODULES = ("throwaway_recipes", "throwaway_broken")


def make_distribution(root: Path) -> Path:
    info = root / "throwaway_plugin-1.2.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: throwaway-plugin\nVersion: 1.2.3\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [embodichain.sl_factories]
        throwaway = throwaway_recipes:build_supervised_trainer
        throwaway_broken = throwaway_broken:build_supervised_trainer

        [console_scripts]
        unrelated = throwaway_recipes:main
        """))
    (root / "throwaway_recipes.py").write_text(textwrap.dedent("""\
        import dataclasses


        @dataclasses.dataclass
        class Settings:
            width: int = 3


        def build_supervised_trainer(config, device):
            raise NotImplementedError


        build_supervised_trainer.config_schema = Settings
        """))
    (root / "throwaway_broken.py").write_text(
        'raise RuntimeError("plugin exploded on import")\n')
    return root


@pytest.fixture()
def plugin_path(tmp_path, monkeypatch) -> Path:
    root = make_distribution(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in MODULES:
        sys.modules.pop(name, None)


def by_name(infos: list[FactoryInfo]) -> dict[str, FactoryInfo]:
    return {info.name: info for info in infos}


def test_entry_points_of_an_installed_distribution_are_listed(plugin_path):
    found = by_name(registered_factories())
    assert found["throwaway"].target == "throwaway_recipes:build_supervised_trainer"
    assert found["throwaway"].distribution == "throwaway-plugin"
    assert found["throwaway"].version == "1.2.3"
    assert "throwaway_broken" in found  # listed without being imported
    assert "throwaway_broken" not in sys.modules
    assert "unrelated" not in found  # other groups are not factories
    assert found["sl_ddp"].distribution == embodichain.DISTRIBUTION  # the built-in, same mechanism


def test_a_registered_factory_resolves_by_name(plugin_path):
    factory = resolve_factory("throwaway")
    assert factory.__module__ == "throwaway_recipes"
    assert factory.__name__ == "build_supervised_trainer"
    assert factory.config_schema.__name__ == "Settings"


def test_a_broken_plugin_is_reported_by_name_and_breaks_nothing_else(plugin_path):
    with pytest.raises(FactoryError) as error:
        resolve_factory("throwaway_broken")
    message = str(error.value)
    assert "throwaway_broken" in message and "plugin exploded on import" in message
    assert "throwaway-plugin" in message  # the distribution that ships it

    checked = by_name(check_factory(info) for info in registered_factories())
    assert "plugin exploded on import" in checked["throwaway_broken"].error
    assert checked["throwaway"].error is None
    assert checked["sl_ddp"].error is None
    assert resolve_factory("sl_ddp").__name__ == "build_supervised_trainer"
    assert resolve_factory("throwaway").__module__ == "throwaway_recipes"


def test_module_attribute_strings_resolve(plugin_path):
    from embodichain.plugins import sl_ddp

    assert resolve_factory("embodichain.plugins.sl_ddp:build_supervised_trainer") is \
        sl_ddp.build_supervised_trainer
    assert resolve_factory("throwaway_recipes:build_supervised_trainer") is \
        resolve_factory("throwaway")


@pytest.mark.parametrize(("reference", "reason"), [
    ("no_such_module_xyz:build", "no_such_module_xyz"),
    ("embodichain.plugins.sl_ddp:no_such_attribute", "no_such_attribute"),
    ("embodichain.plugins.sl_ddp:_W0", "not callable"),  # a tuple
    ("throwaway_broken:build_supervised_trainer", "plugin exploded on import"),
])
def test_unresolvable_module_attribute_strings_say_why(plugin_path, reference, reason):
    with pytest.raises(FactoryError, match=reason):
        resolve_factory(reference)


def test_an_unknown_name_lists_the_registered_ones(plugin_path):
    with pytest.raises(FactoryError) as error:
        resolve_factory("throwawy")
    message = str(error.value)
    assert "throwawy" in message and "sl_ddp" in message and "throwaway" in message


def test_without_the_distribution_its_factories_are_gone(plugin_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin_path)])
    assert "throwaway" not in by_name(registered_factories())
    with pytest.raises(FactoryError, match="throwaway"):
        resolve_factory("throwaway")


def test_list_factories_reports_the_broken_plugin_and_lists_the_rest(tmp_path):
    root = make_distribution(tmp_path / "site")
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    proc = run_cli("list-factories", env=worker_env(PYTHONPATH=path, COLUMNS="200"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    for name in ("sl_ddp", "throwaway", "throwaway_broken", "throwaway-plugin", "1.2.3"):
        assert name in out, name
    assert "plugin exploded on import" in out
    assert "Traceback" not in out
