"""`validate-config`: every bad recipe is exit 2 with one readable message (R-CFG-5, §9)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import CPU_RECIPE, run_cli, worker_env
from tests.support.cli import DATA_FACTORY, FAKE_FACTORY, invoke, make_plugins, with_pythonpath

GOOD = CPU_RECIPE.read_text()


def edit(*pairs: tuple[str, str]) -> str:
    """The example recipe with textual replacements (keeps its comments and layout)."""
    text = GOOD
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


# (id, recipe text or None for "no file", what the message must contain)
BAD_RECIPES = [
    ("yaml-syntax", edit(("  max_updates: 200", "   max_updates: 200")),
     ["YAML syntax error at line 6, column"]),
    ("yaml-unclosed-flow", edit(("{name: adam, lr: 0.001}", "{name: adam, lr: 0.001")),
     ["YAML syntax error at line", "column", "starts at line 11, column 12"]),
    ("unknown-key-typo", edit(("batch_size: 32", "batchsize: 32")),
     ["trainer.batchsize: unknown key", "did you mean 'batch_size'?"]),
    ("unknown-top-level-key", edit(("optimizer:", "optimiser:")),
     ["optimiser: unknown key", "did you mean 'optimizer'?"]),
    ("wrong-type", edit(("batch_size: 32", "batch_size: 32x")),
     ['trainer.batch_size: expected a positive integer, got "32x"']),
    ("section-not-mapping", edit(("model: {hidden: 32}", "model: 32")),
     ["model: expected a mapping, got 32"]),
    ("out-of-range", edit(("lr: 0.001", "lr: -0.5")),
     ["optimizer.lr: expected a positive number, got -0.5"]),
    ("bad-choice", edit(("device: cpu", "device: gpu")),
     ["device: expected one of", "'cuda'", '"gpu"']),
    ("unknown-factory-name", edit(("factory: sl_ddp", "factory: sl_dpp")),
     ["factory: no factory named 'sl_dpp'", "did you mean 'sl_ddp'?",
      "embodichain.sl_factories"]),
    ("module-missing", edit(("factory: sl_ddp", "factory: no_such_pkg.recipes:build")),
     ["factory:", "cannot import module 'no_such_pkg.recipes'", "no module named 'no_such_pkg'"]),
    ("attribute-missing", edit(("factory: sl_ddp", "factory: embodichain.plugins.sl_ddp:nope")),
     ["factory:", "has no attribute 'nope'"]),
    ("plugin-raises-on-import", edit(("factory: sl_ddp", f"factory: {FAKE_FACTORY}")),
     ["factory:", "fakeplugin 0.1", "RuntimeError: fakeplugin is broken on purpose"]),
    ("two-errors-at-once", edit(("lr: 0.001", "lr: 0"), ("hidden: 32", "hiden: 32")),
     ["2 problems", "optimizer.lr: expected a positive number",
      "model.hiden: unknown key (did you mean 'hidden'?)"]),
    ("factory-and-framework-errors", edit(("factory: sl_ddp", "factory: sl_dpp"),
                                          ("max_updates: 200", "max_updates: -1")),
     ["2 problems", "no factory named 'sl_dpp'", "trainer.max_updates: expected a positive"]),
    ("duplicate-key", GOOD + "seed: 1\n", ["duplicate key 'seed'", "line 2"]),
    ("missing-data-path", "factory: " + DATA_FACTORY + "\n" + edit(
        ("factory: sl_ddp\n", ""), ("model: {hidden: 32}           # 4 -> hidden -> 2 MLP\n", ""),
        ("data: {train_size: 4096, val_size: 1024, seed: 1234}", "data: {path: no/such.pt}")),
     ["data.path: file not found", "no/such.pt"]),
    ("not-a-mapping", "- factory\n- sl_ddp\n", ["expected a mapping at the top level"]),
    ("empty-file", "", ["the file is empty"]),
    ("comments-only", "# nothing here\n", ["the file is empty"]),
    ("missing-file", None, ["file not found"]),
]


@pytest.fixture()
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_plugins(tmp_path / "plugins")
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.mark.parametrize("text, expected", [(t, e) for _, t, e in BAD_RECIPES],
                         ids=[name for name, _, _ in BAD_RECIPES])
def test_bad_recipe_exits_2_with_a_clear_message(tmp_path: Path, plugins: Path,
                                                 text: str | None, expected: list[str]) -> None:
    recipe = tmp_path / "recipe.yaml"
    if text is not None:
        recipe.write_text(text)
    before = _files(tmp_path)
    result = invoke("validate-config", str(recipe))
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert message.startswith("error: invalid recipe "), message
    assert str(recipe) in message  # names the file
    for part in expected:
        assert part in message, f"{part!r} not in:\n{message}"
    assert "Traceback" not in result.output
    assert result.stdout == ""  # no resolved recipe printed
    assert _files(tmp_path) == before  # nothing written


def _files(root: Path) -> list[Path]:
    """Every path below `root` but Python's bytecode caches (importing a plugin makes them
    where PYTHONDONTWRITEBYTECODE is not set; the command itself writes nothing)."""
    return sorted(p for p in root.rglob("*") if "__pycache__" not in p.parts)


def test_good_recipe_exits_0_and_prints_the_resolved_recipe(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.chdir(tmp_path)  # output_dir is relative: it must not be created
    result = invoke("validate-config", str(CPU_RECIPE))
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["factory"] == "sl_ddp"
    assert resolved["trainer"]["batch_size"] == 32
    assert resolved["optimizer"] == {"name": "adam", "lr": 0.001, "weight_decay": 0.0,
                                     "grad_clip": None, "betas": None, "eps": None,
                                     "momentum": None, "nesterov": False,
                                     "no_decay": [], "fused": False}  # defaults filled in
    assert resolved["model"] == {"hidden": 32}
    assert "valid" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_set_problems_are_reported_with_the_file_problems(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(edit(("lr: 0.001", "lr: 0")))
    result = invoke("validate-config", str(recipe), "--set", "trainer.batch_size=many")
    assert result.exit_code == 2
    assert "optimizer.lr: expected a positive number" in result.stderr
    assert ('trainer.batch_size: expected a positive integer, got "many" '
            "(from --set trainer.batch_size=many)") in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(edit(("lr: 0.001", "lr: 0")))
    result = invoke("validate-config", str(recipe), "--debug")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr and "optimizer.lr" in result.stderr


def test_real_process_exit_code_and_no_traceback(tmp_path: Path) -> None:
    """The same verdicts from a separate process: exit status 2, one paragraph on stderr."""
    plugins = make_plugins(tmp_path / "plugins")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(edit(("factory: sl_ddp", f"factory: {FAKE_FACTORY}"),
                           ("batch_size: 32", "batch_size: 0")))
    proc = run_cli("validate-config", str(recipe), cwd=tmp_path,
                   env=with_pythonpath(worker_env(), plugins))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "RuntimeError: fakeplugin is broken on purpose" in proc.stderr
    assert "trainer.batch_size: expected a positive integer, got 0" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plugins", "r.yaml"]
