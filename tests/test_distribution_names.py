"""The distributions' names (docs/development.md, "Names"): ours is `embodichain-sl` (the
import package and the command stay `embodichain`), and no requirement of either
distribution names `embodichain`, which on PyPI is another project (the EmbodiChain
platform, 0.3.2).

Catches: the plugin depending on `embodichain` (as it did: `pip install embodichain-models`
from an index then pulled that other project instead of this framework), an extra of ours
spelled `embodichain[...]` (`pip install -e .[dev]` would install the other project beside
ours), and metadata looked up by the old name (the artifact's provenance)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import embodichain
from embodichain.core.deploy.interface import PACKAGES
from tests.support import REPO

PLUGIN = REPO / "plugins" / "embodichain-models" / "pyproject.toml"
OTHER = "embodichain"  # PyPI's: another project


def _project(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)["project"]


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_our_distribution_has_a_name_of_its_own_and_keeps_its_command() -> None:
    project = _project(REPO / "pyproject.toml")
    assert canonicalize_name(project["name"]) == canonicalize_name(embodichain.DISTRIBUTION)
    assert canonicalize_name(embodichain.DISTRIBUTION) != OTHER
    assert project["scripts"] == {"embodichain": "embodichain.cli:main"}


@pytest.mark.parametrize("pyproject", [REPO / "pyproject.toml", PLUGIN],
                         ids=["embodichain-sl", "embodichain-models"])
def test_no_requirement_names_the_other_project(pyproject: Path) -> None:
    project = _project(pyproject)
    groups = {"dependencies": project.get("dependencies", []),
              **{f"[{k}]": v for k, v in project.get("optional-dependencies", {}).items()}}
    for where, requirements in groups.items():
        assert OTHER not in _names(requirements), f"{pyproject}: {where} {requirements}"


def test_the_plugin_depends_on_our_distribution_as_declared_and_installed() -> None:
    ours = canonicalize_name(embodichain.DISTRIBUTION)
    assert ours in _names(_project(PLUGIN)["dependencies"])
    installed = _names([r for r in importlib.metadata.requires("embodichain-models") or []
                        if "extra ==" not in r])
    assert ours in installed and OTHER not in installed, installed
    assert importlib.metadata.version(embodichain.DISTRIBUTION) == embodichain.__version__


def test_an_artifacts_provenance_asks_for_our_distribution() -> None:
    assert embodichain.DISTRIBUTION in PACKAGES and OTHER not in PACKAGES
