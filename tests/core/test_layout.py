"""The layout rules of design §2 / R-ARCH-1, read from the source with `ast` (nothing imported).

Catches: an import cycle between two modules (e.g. trainer <-> callbacks, also through a
function-level or TYPE_CHECKING import), a cycle between `core` sub-packages, a bottom
sub-package (recipe, data, distributed) importing another one, anything importing
`core.launch`, a module importing another module's private name, a module over 450 lines, and
the framework importing the models plugin (R-LAYER-1).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "embodichain"
BOTTOM = {"recipe", "data", "distributed"}
# shared by every sub-package, importing nothing of core
ROOT_MODULES = {"errors", "file_hash", "tensor_bytes"}
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import in the module, at any depth."""
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{node.module}.{alias.name}"
                found.append((sub, []) if sub in MODULES else (node.module, [alias.name]))
    return [(target, names) for target, names in found if target.startswith("embodichain")]


def graph() -> dict[str, set[str]]:
    # A package's __init__ imports only re-export (learning.sl) or nothing; importing a
    # module of a package does not count as depending on its __init__.
    return {name: {t for t, _ in imports_of(name) if t in MODULES and t != name}
            for name in MODULES}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def core_part(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "core" else None


def test_no_import_cycle_between_modules() -> None:
    assert find_cycle(graph()) is None, f"import cycle: {' -> '.join(find_cycle(graph()))}"


def test_core_sub_packages_are_layered() -> None:
    parts: dict[str, set[str]] = {}
    for source, targets in graph().items():
        a = core_part(source)
        for target in targets:
            b = core_part(target)
            if a and b and a != b and a not in ROOT_MODULES and b not in ROOT_MODULES:
                parts.setdefault(a, set()).add(b)
    assert find_cycle(parts) is None, f"sub-package cycle: {' -> '.join(find_cycle(parts))}"
    for part in BOTTOM:
        assert not parts.get(part), f"core.{part} imports {sorted(parts[part])}"
    assert not [p for p, targets in parts.items() if "launch" in targets], \
        "core.launch is the top layer: no sub-package may import it"
    for root in ROOT_MODULES:
        assert not [t for t in graph()[f"embodichain.core.{root}"] if core_part(t)], \
            f"core.{root} is shared by all: it imports nothing of core"


def test_core_root_holds_only_the_shared_modules() -> None:
    at_root = {p.stem for p in (PACKAGE / "core").glob("*.py")} - {"__init__"}
    assert at_root == ROOT_MODULES
    for sub in (PACKAGE / "core").iterdir():
        if sub.is_dir() and sub.name != "__pycache__":
            doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text()))
            assert doc, f"core/{sub.name}/__init__.py says what it owns in its docstring"


def test_no_module_imports_another_modules_private_names() -> None:
    bad = [f"{name} takes {n} from {target}" for name in MODULES
           for target, names in imports_of(name) for n in names
           if n.startswith("_") and target != name]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_short_enough(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name]} has {lines} lines (at most {MAX_LINES})"


TRAINER, TRAINER_LINES, FIT_LINES = "embodichain.core.training.trainer", 330, 60


def test_the_trainer_stays_a_loop_and_fit_a_screen() -> None:
    """The fit loop's module holds the loop: what grows (validation, saving, recovery) goes
    into the modules beside it (issue 51). Catches trainer.py past 330 lines, or `fit()`
    past 60."""
    source = MODULES[TRAINER].read_text()
    assert len(source.splitlines()) <= TRAINER_LINES
    (fit,) = [node for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.FunctionDef) and node.name == "fit"]
    assert fit.end_lineno is not None and fit.end_lineno - fit.lineno + 1 <= FIT_LINES


def test_the_framework_never_imports_the_models_plugin() -> None:
    """R-LAYER-1: the framework sits below its plugins. Catches `embodichain/core/deploy/
    evaluate.py` taking the artifact runner from `embodichain_models.deploy.runner` (then
    `embodichain eval ARTIFACT` fails for a user who installed only embodichain), or any other
    module of `embodichain/` importing `embodichain_models` (also inside a function)."""
    bad = [f"{name} imports {target}" for name in MODULES for target, _ in imports_of(name)
           if target.split(".")[0] == "embodichain_models"]
    assert not bad, "\n".join(bad)


def test_no_command_borrows_from_another_command() -> None:
    """A helper two commands share lives in a module both can see (cli/common.py,
    cli/launching.py), not in one command's module. Catches `cli/eval_cmd.py` taking
    `launch_if_asked` or the launch options from `cli/train_cmd.py`, and `config_cmd.py`
    taking `print_recipe` from it."""
    commands = {name for name in MODULES if name.startswith("embodichain.cli.")
                and name.endswith("_cmd")}
    bad = [f"{name} imports {target}" for name in commands for target, _ in imports_of(name)
           if target in commands and target != name]
    assert not bad, "\n".join(bad)


def test_the_checks_can_fail() -> None:
    """The cycle finder itself: a two-module cycle and a three-module one are found."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


SHARDED_FORMAT = {f"embodichain.core.checkpoint.{m}"
                  for m in ("sharded", "sharded_writer", "recut", "recut_exchange")}


def test_resume_checks_ask_the_strategy_not_the_sharded_format() -> None:
    """R-STRAT-1's seam: the start-up and the run directory's rules ask the strategy's
    checkpoint format (core/checkpoint/formats.py), never the sharded format itself; and
    `Strategy.prepare` takes no option of one strategy. Catches launch/start.py,
    runs/resume_policy.py or runs/snapshots.py importing core/checkpoint/sharded to check
    shards at resume (any import, also inside a function), and `prepare(model, groups, *,
    shard_blocks, reshard_after_forward)`."""
    bad = [f"{name} imports {target}" for name in MODULES if core_part(name) in ("launch", "runs")
           for target, _ in imports_of(name) if target in SHARDED_FORMAT]
    assert not bad, "\n".join(bad)
    base = ast.parse(MODULES["embodichain.core.training.strategies.base"].read_text())
    strategy = next(n for n in base.body if isinstance(n, ast.ClassDef) and n.name == "Strategy")
    prepare = next(n for n in strategy.body
                   if isinstance(n, ast.FunctionDef) and n.name == "prepare")
    assert [a.arg for a in prepare.args.args + prepare.args.kwonlyargs] == [
        "self", "model", "param_groups"]
