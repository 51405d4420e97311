"""`embodichain init`: packaged example recipes, written as editable copies (no checkout)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from embodichain.core.recipe.packaged import recipe_text, registered_recipes
from tests.support import CPU_RECIPE, REPO, assert_ok, run_cli
from tests.support.cli import invoke

NERD_RECIPE = REPO / "examples" / "learning" / "nerd" / "configs" / "cartpole" / "sl.train.yaml"


def test_packaged_recipes_are_the_examples() -> None:
    assert {r.name for r in registered_recipes()} >= {"sl_ddp", "nerd"}
    assert yaml.safe_load(recipe_text("sl_ddp")) == yaml.safe_load(CPU_RECIPE.read_text())
    assert yaml.safe_load(recipe_text("nerd")) == yaml.safe_load(NERD_RECIPE.read_text())


def test_packaged_sl_ddp_resolves_like_the_example(tmp_path: Path) -> None:
    from embodichain.core.recipe.loading import load_recipe

    copy = tmp_path / "r.yaml"
    copy.write_text(recipe_text("sl_ddp"))
    assert load_recipe(copy).resolved == load_recipe(CPU_RECIPE).resolved


def test_init_writes_a_commented_copy_and_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "nerd.yaml"
    result = invoke("init", "nerd", str(target))
    assert result.exit_code == 0, result.output
    text = target.read_text()
    assert "python -m embodichain_models.dynamics.nerd.prepare --out data/nerd/cartpole" in text
    assert f"embodichain train-sl --config {target}" in text
    assert yaml.safe_load(text) == yaml.safe_load(NERD_RECIPE.read_text())

    target.write_text("mine\n")
    again = invoke("init", "sl_ddp", str(target))
    assert again.exit_code == 2
    assert "already exists" in again.output
    assert target.read_text() == "mine\n"


def test_init_unknown_recipe_names_the_close_one(tmp_path: Path) -> None:
    result = invoke("init", "sl_dp", str(tmp_path / "r.yaml"))
    assert result.exit_code == 2
    assert "did you mean 'sl_ddp'" in result.output
    assert not (tmp_path / "r.yaml").exists()


def test_list_factories_says_which_have_a_recipe() -> None:
    result = invoke("list-factories")
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines()
            if line.count("│") > 3 and line.split("│")[1].strip() in ("sl_ddp", "nerd")}
    assert "init sl_ddp" in rows["sl_ddp"] and "init nerd" in rows["nerd"], result.output


def test_init_then_train_outside_the_checkout(tmp_path: Path) -> None:
    assert REPO not in tmp_path.parents
    assert_ok(run_cli("init", "sl_ddp", "r.yaml", cwd=tmp_path))
    assert_ok(run_cli("train-sl", "--config", "r.yaml", "--set", "trainer.max_updates=60",
                      "--no-progress", cwd=tmp_path))
    run = tmp_path / "outputs" / "sl_ddp_cpu"  # the recipe's relative output_dir, under cwd
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 60
    assert (run / "last.pt").is_file() and (run / "run.json").is_file()
