"""A checkpoint written before its factory's schema grew a key stays resumable at the key's
default, and only there (R-RESUME-2); `train-sl` and `inspect-checkpoint --config` agree.

The factory is tests/factories/growing.py: sl_ddp, whose `data` section gains
`data.train_episodes` (default 0) when EMBODICHAIN_TEST_GROWN_SCHEMA is set at its import.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.recipe.schema import FrameworkConfig, combined_schema, default_at
from embodichain.core.runs.config_compat import config_differences
from embodichain.plugins.sl_ddp_schema import SlDdpConfig
from tests.support import assert_ok, factories_env, run_cli, write_recipe
from tests.support.state_compare import assert_training_state_equal

SMALL = {"factory": "growing:build_supervised_trainer", "trainer.batch_size": 8,
         "trainer.max_updates": 8, "trainer.save_every": 4, "trainer.validate_every": 0,
         "trainer.log_every": 1, "model.hidden": 8, "data.train_size": 256,
         "data.val_size": 64}
OLD, GROWN = factories_env(), factories_env(EMBODICHAIN_TEST_GROWN_SCHEMA="1")


@pytest.fixture(scope="module")
def before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run trained by the factory before its schema grew: step_4.pt, step_8.pt, last.pt."""
    root = tmp_path_factory.mktemp("growth")
    recipe = write_recipe(root / "old.yaml", root / "before", **SMALL)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=OLD))
    assert "train_episodes" not in read_checkpoint(root / "before" / "step_4.pt")[
        "payload"]["run"]["config"]["data"]
    return root / "before"


@pytest.fixture(scope="module")
def resumed(before: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of `before` at update 4, resumed in place to 8 by the grown factory."""
    run = tmp_path_factory.mktemp("grown") / "run"
    shutil.copytree(before, run)
    for name in ("step_8.pt", "last.pt"):  # in place from update 4 (later metrics rolled back)
        (run / name).unlink()
    proc = run_cli("resume", str(run), "--no-progress", env=GROWN)
    assert_ok(proc)
    (run.parent / "resume.out").write_text(proc.stdout + proc.stderr)  # what the user saw
    return run


def test_a_grown_key_at_its_default_resumes_exactly(before: Path, resumed: Path,
                                                    tmp_path: Path) -> None:
    """Catches a key the schema gained refusing every older checkpoint (`data.train_episodes:
    checkpoint '<absent>', this run 0`), inspect-checkpoint disagreeing with train-sl, a
    resume that does not continue bitwise, run.json not recording the key it lacked, and
    the key added silently (R-PREEMPT-3: neither the resume nor `inspect-checkpoint
    --config` says "added since this checkpoint")."""
    recipe = write_recipe(tmp_path / "grown.yaml", tmp_path / "unused", **SMALL)
    verdict = run_cli("inspect-checkpoint", str(before / "step_4.pt"), "--json", "--config",
                      str(recipe), env=GROWN)
    assert_ok(verdict)
    assert json.loads(verdict.stdout)["resume"]["differences"] == []
    added = "added since this checkpoint: data.train_episodes = 0 (the default)"
    assert json.loads(verdict.stdout)["resume"]["added"] == added
    shown = run_cli("inspect-checkpoint", str(before / "step_4.pt"), "--config", str(recipe),
                    env=GROWN)
    assert_ok(shown)
    assert added in " ".join(shown.stdout.split()), shown.stdout
    assert added in (resumed.parent / "resume.out").read_text()  # printed at resume too
    assert_training_state_equal(resumed / "step_8.pt", before / "step_8.pt")
    identity = json.loads((resumed / "run.json").read_text())
    assert identity["config"]["data"]["train_episodes"] == 0
    resumed_event = [e for e in identity["events"] if e["event"] == "resumed"][-1]
    assert resumed_event["config_keys_added"] == ["data.train_episodes"]
    saved = read_checkpoint(resumed / "step_8.pt")["payload"]["run"]["config"]
    assert saved["data"]["train_episodes"] == 0


def test_a_grown_key_off_its_default_is_refused(before: Path, tmp_path: Path) -> None:
    """Catches a key the checkpoint lacks being waved through whatever its value (it changes
    what is trained), or refused without naming it and both values."""
    recipe = write_recipe(tmp_path / "five.yaml", tmp_path / "fresh", **SMALL,
                          **{"data.train_episodes": 5})
    expected = "data.train_episodes: checkpoint 0, this run 5"
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(before / "step_4.pt"),
                   "--no-progress", env=GROWN)
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "fresh").exists()
    verdict = run_cli("inspect-checkpoint", str(before / "step_4.pt"), "--json", "--config",
                      str(recipe), env=GROWN)
    assert json.loads(verdict.stdout)["resume"]["differences"] == [expected]


def test_a_removed_key_is_refused(resumed: Path, tmp_path: Path) -> None:
    """Catches a key the checkpoint has and this schema lacks (renamed or removed) passing as
    no difference: its meaning is gone, so the checkpoint is not this run's."""
    old = write_recipe(tmp_path / "old.yaml", tmp_path / "fresh", **SMALL)
    proc = run_cli("train-sl", "--config", str(old), "--resume", str(resumed / "step_8.pt"),
                   "--no-progress", "--set", "trainer.max_updates=9", env=OLD)
    assert proc.returncode == 2, proc.stderr
    assert "data.train_episodes: checkpoint 0, this run '<absent>'" in proc.stderr
    assert not (tmp_path / "fresh").exists()


def _framework(**trainer: object) -> dict:
    return FrameworkConfig.model_validate({
        "factory": "f", "trainer": {"batch_size": 4, "max_updates": 5, "output_dir": "o",
                                    **trainer},
        "optimizer": {"name": "adam", "lr": 0.001}}).model_dump(mode="json")


def test_framework_keys_newer_than_a_checkpoint() -> None:
    """Catches defaults kept in a hand-made table instead of read off the schema (a framework
    key missing from the table, here `optimizer.weight_decay` and `seed`, refused an older
    checkpoint at its default), and a section absent from the checkpoint passing because its
    own fields have defaults although the section's default is none (`scheduler`)."""
    current = _framework()
    saved = json.loads(json.dumps(current))
    del saved["optimizer"]["weight_decay"], saved["seed"]
    assert config_differences(saved, current, 0) == []
    decayed = {**current, "optimizer": {**current["optimizer"], "weight_decay": 0.1}}
    assert config_differences(saved, decayed, 0) == [
        "optimizer.weight_decay: checkpoint 0.0, this run 0.1"]
    del saved["scheduler"]
    scheduled = {**current, "scheduler": {"name": "constant", "end_lr": 0.0,
                                          "warmup_updates": 0}}
    assert config_differences(saved, scheduled, 0) == [  # its default is none at all
        "scheduler.end_lr: checkpoint '<absent>', this run 0.0",
        "scheduler.name: checkpoint '<absent>', this run 'constant'",
        "scheduler.warmup_updates: checkpoint '<absent>', this run 0"]


def test_a_whole_factory_section_newer_than_a_checkpoint() -> None:
    """Catches nested defaults not read (a section with a model default, `model: ModelConfig()`,
    absent from the checkpoint) and the factory's schema not consulted at all."""
    schema = combined_schema(SlDdpConfig)
    assert default_at(schema, "model") == {"hidden": 32}
    assert default_at(schema, "data.seed") == 1234
    current = {**_framework(), "model": {"hidden": 32}, "data": {"train_size": 8,
                                                                  "val_size": 8, "seed": 1}}
    saved = {k: v for k, v in current.items() if k != "model"}
    assert config_differences(saved, current, 0, schema) == []
    assert config_differences(saved, current, 0) == [  # the framework's schema alone
        "model.hidden: checkpoint '<absent>', this run 32"]
    wider = {**current, "model": {"hidden": 64}}
    assert config_differences(saved, wider, 0, schema) == [
        "model.hidden: checkpoint '<absent>', this run 64"]
