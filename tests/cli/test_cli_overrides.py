"""`--set` overrides typed by the schema, and `--print-config` (R-CFG-3, R-CFG-4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from embodichain.core.errors import ConfigError
from embodichain.core.recipe.loading import apply_overrides
from embodichain.core.recipe.schema import FrameworkConfig
from tests.support import CPU_RECIPE
from tests.support.cli import invoke


def print_config(*overrides: str) -> dict:
    args = ["train-sl", "--config", str(CPU_RECIPE), "--print-config"]
    for item in overrides:
        args += ["--set", item]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.stdout)


def test_print_config_shows_the_resolved_recipe_without_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    resolved = print_config()
    assert resolved["trainer"]["output_dir"] == "outputs/sl_ddp_cpu"
    assert resolved["trainer"]["save_best"] is False  # defaults filled in
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_nested_overrides_are_typed_by_the_schema() -> None:
    resolved = print_config("trainer.batch_size=64", "optimizer.lr=1.0e-2",
                            "optimizer.grad_clip=0.5", "model.hidden=8",
                            "trainer.output_dir=2024", "scheduler.name=cosine",
                            "scheduler.warmup_updates=10", "seed=7")
    assert resolved["trainer"]["batch_size"] == 64
    assert type(resolved["trainer"]["batch_size"]) is int
    assert resolved["optimizer"]["lr"] == 0.01 and resolved["optimizer"]["grad_clip"] == 0.5
    assert resolved["model"]["hidden"] == 8  # a factory-owned section
    assert resolved["trainer"]["output_dir"] == "2024"  # a text field keeps the text
    assert resolved["scheduler"] == {"name": "cosine", "end_lr": 0.0, "warmup_updates": 10}
    assert resolved["seed"] == 7


def test_last_override_wins_and_null_clears() -> None:
    resolved = print_config("optimizer.grad_clip=1.0", "optimizer.grad_clip=null",
                            "model.hidden=4", "model.hidden=16")
    assert resolved["optimizer"]["grad_clip"] is None
    assert resolved["model"]["hidden"] == 16


@pytest.mark.parametrize("item, expected", [
    ("trainer.batchsize=64", ["trainer.batchsize: unknown key", "did you mean 'batch_size'?",
                              "from --set trainer.batchsize=64"]),
    ("trainr.batch_size=64", ["trainr: unknown key", "did you mean 'trainer'?"]),
    ("model.hiden=64", ["model.hiden: unknown key", "did you mean 'hidden'?"]),
    ("trainer.batch_size=lots", ['trainer.batch_size: expected a positive integer, got "lots"']),
    ("optimizer.name=adamx", ["optimizer.name: expected one of", '"adamx"']),
    ("optimizer.lr.x=1", ["--set optimizer.lr.x: optimizer.lr is not a section"]),
    ("trainer.batch_size", ["--set 'trainer.batch_size': expected KEY=VALUE"]),
    ("=3", ["expected KEY=VALUE"]),
])
def test_bad_override_exits_2_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        item: str, expected: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("train-sl", "--config", str(CPU_RECIPE), "--set", item)
    assert result.exit_code == 2, result.output
    for part in expected:
        assert part in result.stderr, f"{part!r} not in:\n{result.stderr}"
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # refused before any training or writing


def test_apply_overrides_unit() -> None:
    raw = {"factory": "sl_ddp", "trainer": {"batch_size": 32}, "scheduler": None}
    out = apply_overrides(raw, ["trainer.batch_size=64", "trainer.output_dir=007",
                                "scheduler.name=linear", "new.deep.key=[1, 2]",
                                "device=on"], FrameworkConfig)
    assert out["trainer"] == {"batch_size": 64, "output_dir": "007"}
    assert out["scheduler"] == {"name": "linear"}  # a null section becomes a mapping
    assert out["new"] == {"deep": {"key": [1, 2]}}
    assert out["device"] == "on"  # a string choice: not YAML's boolean `on`
    assert raw["trainer"] == {"batch_size": 32}  # the input is not modified
    untyped = apply_overrides(raw, ["trainer.output_dir=007"])
    assert untyped["trainer"]["output_dir"] == 7  # without a schema: YAML's reading
    with pytest.raises(ConfigError) as info:
        apply_overrides(raw, ["nokey", "trainer.batch_size.x=1"])
    assert len(info.value.problems) == 2
