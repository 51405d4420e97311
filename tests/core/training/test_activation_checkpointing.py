"""`trainer.activation_checkpointing` (R-OPS-4): the named module classes recompute their
forward in the backward; training is bitwise the run without it, under ddp and fsdp, in
fp32 and bf16, and a checkpoint resumes with or without it.

The model (tests/factories/dropout_blocks.py) is two residual blocks with dropout, which are
also FSDP2's shard groups: a recomputation that drew new dropout masks, lost the forward's
autocast, or ran without FSDP gathering the block's parameters again would change the
weights. The 2-rank runs (torchrun, gloo) are chains: updates 1-3 one way, resumed for 4-6
the other way, against a run of 6 updates done one way throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import read_shard, shard_table
from embodichain.core.deploy.trained import trained_model
from embodichain.core.errors import UsageError
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.core.training.activation_checkpointing import checkpointed_modules
from embodichain.core.training.learner import Learner
from embodichain.plugins import sl_ddp
from tests.factories.dropout_blocks import DropoutBlock, make_model
from tests.support import FACTORIES, assert_ok, factories_env, run_torchrun, write_recipe
from tests.support.cli import invoke
from tests.support.state_compare import (
    assert_state_equal,
    assert_training_state_equal,
    comparable_records,
)

pytestmark = pytest.mark.usefixtures("factories_on_path")
BLOCKS = {"modules": ["DropoutBlock"]}
RUN = {"factory": "dropout_blocks:build_supervised_trainer", "model": {"hidden": 16},
       "trainer.max_updates": 6, "trainer.save_every": 3, "trainer.validate_every": 3,
       "trainer.log_every": 1, "trainer.grad_accumulation": 2, "trainer.precision": "bf16",
       "trainer.ema": {"decay": 0.5, "validate": "both"}}


@pytest.fixture
def factories_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FACTORIES))  # dropout_blocks, also for in-process CLI


# -- in one process: the learner's update, the choice of modules ----------------------------


def trained(precision: str, modules: tuple[str, ...]) -> tuple[Learner, torch.Tensor]:
    """Three updates of the dropout model; the learner, and a draw of the global RNG after."""
    torch.manual_seed(0)
    learner = Learner(make_model(8), OptimizerConfig(name="adam", lr=0.01), None, 3,
                      torch.device("cpu"), precision, activation_checkpointing=modules)
    data = sl_ddp.make_corpus(32, 1)
    for _ in range(3):
        learner.update(sl_ddp.masked_mse, data)
    learner.settle()
    return learner, torch.rand(4)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_checkpointed_update_is_bitwise_the_plain_one(precision: str) -> None:
    """Catches: the recomputation drawing new dropout masks (no RNG state replayed), running
    outside the forward's autocast (bf16), or moving the global RNG stream on; and a
    parameter renamed by a wrapper (`_checkpoint_wrapped_module.`), which checkpoints and
    the optimizer's groups would no longer match."""
    plain, after_plain = trained(precision, ())
    checkpointed, after = trained(precision, ("DropoutBlock",))
    assert checkpointed.checkpointed == ["1", "2"]
    assert_state_equal(plain.model.state_dict(), checkpointed.model.state_dict())
    assert torch.equal(after_plain, after)
    # the blocks really recompute: their layers run again in the backward
    calls = []
    checkpointed.model[1].up.register_forward_hook(lambda *_: calls.append(1))
    sl_ddp.masked_mse(checkpointed.model, sl_ddp.make_corpus(4, 2)).loss.backward()
    assert len(calls) == 2


def test_only_the_outermost_named_modules_are_checkpointed() -> None:
    """Catches: a Linear inside a checkpointed block checkpointed again (nested
    recomputation: its forward would run three times), or a named class matched on the
    root model itself."""
    model = make_model(4)
    chosen = checkpointed_modules(model, ["Linear", "DropoutBlock"])
    assert [name for name, _ in chosen] == ["0", "1", "2", "3"]
    assert all(isinstance(m, DropoutBlock) for _, m in chosen[1:3])
    with pytest.raises(UsageError, match="'Sequential' is not a class of the model's "
                       "sub-modules; the model has: Dropout, DropoutBlock, LayerNorm, Linear$"):
        checkpointed_modules(model, ["Sequential"])


# -- refusals: train-sl and validate-config --------------------------------------------------


def test_an_unknown_class_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Catches: a misspelt class silently checkpointing nothing (the run would train with
    all its activations and no word), a refusal that is not exit 2 or does not say which
    classes there are, or a run directory created before the refusal; validate-config
    --build refuses it alike."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **RUN, **{
        "trainer.activation_checkpointing": {"modules": ["DropoutBlock", "TransformerBlock"]}})
    expected = ("trainer.activation_checkpointing.modules: 'TransformerBlock' is not a class "
                "of the model's sub-modules; the model has: Dropout, DropoutBlock, LayerNorm, "
                "Linear")
    for args in (("train-sl", "--config", str(recipe), "--no-progress"),
                 ("validate-config", str(recipe), "--build")):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.output.split()), result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value, words", [
    ({"modules": []}, "trainer.activation_checkpointing.modules"),
    ({"modules": "DropoutBlock"}, "trainer.activation_checkpointing.modules"),
    ({"modules": ["Dropout Block"]}, "trainer.activation_checkpointing.modules.0"),
    ({"modules": ["DropoutBlock", "DropoutBlock"]}, "more than once"),
    ({"modules": ["DropoutBlock"], "mode": "full"}, "trainer.activation_checkpointing.mode"),
])
def test_validate_config_checks_the_key(tmp_path: Path, value: Any, words: str) -> None:
    """Catches: an empty list, a bare string, a name that cannot be a class, a repeated
    name or an unknown key accepted (without --build: the schema alone refuses them)."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **RUN,
                          **{"trainer.activation_checkpointing": value})
    result = invoke("validate-config", str(recipe))
    assert result.exit_code == 2 and words in result.output, result.output
    good = write_recipe(tmp_path / "g.yaml", tmp_path / "run", **RUN,
                        **{"trainer.activation_checkpointing": BLOCKS})
    assert invoke("validate-config", str(good)).exit_code == 0


def test_compile_with_activation_checkpointing_is_refused(tmp_path: Path) -> None:
    """Catches: trainer.compile with checkpointing let through to fail in the first update's
    backward (torch's recomputation check) instead of at validation with the two keys."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **RUN, **{
        "trainer.activation_checkpointing": BLOCKS, "trainer.compile": True})
    result = invoke("validate-config", str(recipe))
    assert result.exit_code == 2, result.output
    assert "trainer.activation_checkpointing: not available with trainer.compile: true" in \
        " ".join(result.output.split()), result.output


def test_an_export_rebuilds_the_model_without_checkpointing(tmp_path: Path) -> None:
    """A checkpointed run says which modules it checkpoints, and its checkpoint exported:
    the weights load into the plain model, and the model rebuilt to act carries no
    checkpoint hooks (they would be traced into an exported artifact). Catches: renamed
    weights, or the hooks left on the deployed model."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **{
        **RUN, "trainer.max_updates": 2, "trainer.validate_every": 0, "trainer.ema": None,
        "trainer.precision": "fp32", "trainer.activation_checkpointing": BLOCKS})
    trained = invoke("train-sl", "--config", str(recipe), "--no-progress")
    assert trained.exit_code == 0, trained.output
    assert "activation checkpointing: 2 modules recompute their forward in the backward " \
        "(1, 2)" in trained.output
    exported = tmp_path / "model.pt"
    result = invoke("export", str(tmp_path / "run"), str(exported))
    assert result.exit_code == 0, result.output
    make_model(16).load_state_dict(torch.load(exported, weights_only=True))
    rebuilt = trained_model(tmp_path / "run" / "last.pt").model
    assert not any(m._forward_pre_hooks for m in rebuilt.modules())


# -- 2 ranks: ddp and fsdp, with and without, across a resume --------------------------------


def chain(root: Path, name: str, first: dict | None, then: dict | None, **changes: Any
          ) -> Path:
    """Updates 1-3 with `trainer.activation_checkpointing: first`, resumed in place for 4-6
    with `then` (a fresh run of 6 when they are the same)."""
    run = root / name
    recipe = write_recipe(root / f"{name}.yaml", run, **{
        **RUN, **changes, "trainer.activation_checkpointing": first,
        "trainer.max_updates": 6 if first == then else 3})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=factories_env()))
    if first != then:
        value = "null" if then is None else "{modules: [DropoutBlock]}"
        assert_ok(run_torchrun("resume", str(run), "--no-progress", "--set",
                               "trainer.max_updates=6", "--set",
                               f"trainer.activation_checkpointing={value}",
                               env=factories_env()))
    return run


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ac_ddp")
    return chain(root, "plain", None, None), chain(root, "mixed", BLOCKS, None)


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ac_fsdp")
    fsdp = {"trainer.strategy": "fsdp"}
    return chain(root, "checkpointed", BLOCKS, BLOCKS, **fsdp), chain(root, "mixed", None,
                                                                       BLOCKS, **fsdp)


def shards(run: Path) -> dict[int, dict[str, Any]]:
    data = read_checkpoint(run / "last.pt")
    found = {}
    for rank in sorted(shard_table(data)):
        payload = read_shard(run, data, rank)["payload"]
        payload.pop("run")
        found[rank] = payload
    return found


@pytest.mark.slow  # 3 torchrun launches
def test_ddp_checkpointed_then_resumed_without_is_bitwise_the_plain_run(
        ddp_runs: tuple[Path, Path]) -> None:
    """DDP in bf16 autocast with accumulation and an EMA. Catches: a checkpointed update
    that differs from the plain one on 2 ranks (masks redrawn, autocast lost, a gradient
    reduced twice or not at all by DDP's hooks), or a checkpoint of a checkpointed model
    that does not load into the plain one (renamed parameters)."""
    plain, mixed = ddp_runs
    assert assert_training_state_equal(plain / "last.pt", mixed / "last.pt") > 20
    assert comparable_records(mixed) == comparable_records(plain)


@pytest.mark.slow  # 3 torchrun launches
def test_fsdp_plain_then_resumed_checkpointed_is_bitwise_the_checkpointed_run(
        fsdp_runs: tuple[Path, Path]) -> None:
    """FSDP2 with its blocks both sharded and checkpointed, bf16 parameters gathered.
    Catches: the recomputation running on a block whose parameters FSDP has freed (an
    error) or on other values, a reduce-scatter per recomputation, and a plain sharded
    checkpoint not resuming into the checkpointed model."""
    checkpointed, mixed = fsdp_runs
    assert assert_state_equal(shards(checkpointed), shards(mixed)) > 20
    assert comparable_records(mixed) == comparable_records(checkpointed)
