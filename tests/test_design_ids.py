"""Requirement ids (`R-RESUME-1`) are for the code's readers: each one cited in the code,
tests or benchmarks is defined in docs/design.md, and none reaches a user (README, the
manual's topic pages, recipes, or a string the program prints).

Catches a cited id that nothing in the repository defines, and an id leaking into a message,
a recipe or the manual."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ID = re.compile(r"\bR-[A-Z]+-\d+\b")
SOURCES = ("embodichain", "plugins", "tests", "benchmarks", "examples")
FOR_DEVELOPERS = {REPO / "docs" / "design.md", REPO / "docs" / "development.md"}


def _files(*suffixes: str) -> list[Path]:
    return [p for top in SOURCES for p in (REPO / top).rglob("*")
            if p.suffix in suffixes and p.is_file() and ".egg-info" not in str(p)]


def _printed_strings(path: Path) -> list[str]:
    """The string constants of a module that are not docstrings (of a module, class,
    function or attribute: a string standing alone as a statement)."""
    tree = ast.parse(path.read_text())
    alone = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in alone]


def test_every_cited_id_is_defined_in_design_md() -> None:
    defined = set(re.findall(r"\*\*(R-[A-Z]+-\d+)\*\*", (REPO / "docs/design.md").read_text()))
    cited = {found: path for path in _files(".py", ".sh", ".md")
             for found in ID.findall(path.read_text())}
    assert cited, "no id found: the pattern or the paths are wrong"
    undefined = {found: str(path.relative_to(REPO)) for found, path in cited.items()
                 if found not in defined}
    assert not undefined, f"cited but not defined in docs/design.md: {undefined}"


def test_no_id_reaches_a_user() -> None:
    user_text = [REPO / "README.md", *(REPO / "docs").glob("*.md"), *_files(".yaml")]
    leaks = [str(p.relative_to(REPO)) for p in user_text
             if p not in FOR_DEVELOPERS and ID.search(p.read_text())]
    product = [p for p in _files(".py") if p.is_relative_to(REPO / "embodichain")
               or p.is_relative_to(REPO / "plugins")]
    leaks += [f"{p.relative_to(REPO)}: {s!r}" for p in product for s in _printed_strings(p)
              if ID.search(s)]
    assert not leaks, leaks


def test_the_checks_see_a_leak(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Keeps R-RUN-5."""\n# R-RUN-5 too\nx = 1\n"""R-RUN-5: x\'s."""\n'
                      'print("refused (R-RUN-5)")\n')
    assert _printed_strings(module) == ["refused (R-RUN-5)"]
