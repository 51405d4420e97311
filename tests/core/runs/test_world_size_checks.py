"""The checks that guard the world size, each on its own (R-ELASTIC-1, R-ELASTIC-4).

Two pairs of checks back each other up, so an end-to-end refusal passes with either one of a
pair removed: a world-size change without `trainer.global_batch_size` is refused by the
resume policy (rank 0, before anything is restored) and again by the strategy as it
restores; a K (micro-batches per update) that does not fit the world is refused when the
recipe is loaded for a world size (`for_world_size`) and again by each worker's trainer
against its process group. Each test here calls one check directly, so it fails when that
check is removed while its partner still stops the run.
"""

from __future__ import annotations

import pytest
import torch
import yaml

from embodichain.core.errors import CheckpointError, ConfigError, UsageError
from embodichain.core.recipe.loading import for_world_size, validate_recipe
from tests.support import CPU_RECIPE


def _recipe(*overrides: str):
    return validate_recipe(yaml.safe_load(CPU_RECIPE.read_text()), overrides=list(overrides))


def _resolved(recipe) -> dict:
    return recipe.config.model_dump(mode="json")


def test_the_resume_policy_alone_refuses_another_world_size_without_g() -> None:
    """`resume_problems` with the same recipe and data, saved on 2 ranks and continued on 1:
    without G one problem, naming both world sizes and `trainer.global_batch_size` as the way
    to allow it; with the same G in both recipes none; with G in only one of them the change
    is still refused. Catches the policy letting a world-size change through without G (the
    strategy's own check would then stop the run later, with other words)."""
    from embodichain.core.runs.resume_policy import resume_problems

    def problems(saved: dict, current: dict) -> list[str]:
        snapshot = {"world_size": 2, "config": saved, "source_identity": "data", "step": 10}
        identity = {"world_size": 1, "source_identity": "data"}
        return resume_problems(snapshot, current, identity)

    plain = _resolved(_recipe())
    refused = problems(plain, plain)
    assert len(refused) == 1, refused
    assert refused[0].startswith("world_size: checkpoint 2, this run 1"), refused
    assert "trainer.global_batch_size" in refused[0]
    elastic = _resolved(_recipe("trainer.global_batch_size=32", "trainer.batch_size=8"))
    assert problems(elastic, elastic) == []
    assert any(p.startswith("world_size: checkpoint 2") for p in problems(plain, elastic))
    assert any(p.startswith("world_size: checkpoint 2") for p in problems(elastic, plain))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_strategy_alone_refuses_another_world_size_without_g(strategy: str) -> None:
    """The strategy's `check_format` (run as it restores, on every rank), in one process: a
    checkpoint of 2 ranks whose recipe has no G is refused naming both world sizes; with G
    it is accepted (the re-cut or rank-0 state follows). Catches a strategy that restores
    another world's state without G (the resume policy's check would then be the only one;
    the programmatic restore path and any policy change would go through)."""
    from embodichain.core.checkpoint.sharded import SHARD_DIRECTORY
    from embodichain.core.training.strategies import make_strategy

    checker = make_strategy(strategy, torch.device("cpu"), "fp32")

    def payload(config: dict) -> dict:
        body = {"run": {"world_size": 2, "config": config}}
        if strategy == "fsdp":
            body["sharded"] = {"strategy": "fsdp", SHARD_DIRECTORY: "shards"}
        return body

    with pytest.raises(CheckpointError, match="world size: checkpoint 2, this run 1"):
        checker.check_format(payload(_resolved(_recipe())))
    checker.check_format(payload(_resolved(_recipe("trainer.global_batch_size=32",
                                                   "trainer.batch_size=8"))))


def test_loading_for_a_world_size_derives_k_and_refuses_what_does_not_divide() -> None:
    """`for_world_size` (what every worker's `load_recipe` and `validate-config
    --nproc-per-node` run): G = 32 in micro-batches of 8 gives K = 4, 2, 1 on 1, 2, 4 ranks;
    3 ranks are refused (ConfigError, exit 2) naming G, the world size and the batch size.
    Catches K derived with the wrong world size, or not checked there (the trainer's check
    would then stop the run later, after the factory built everything)."""
    recipe = _recipe("trainer.global_batch_size=32", "trainer.batch_size=8")
    assert [for_world_size(recipe, w).config.trainer.grad_accumulation for w in (1, 2, 4)] \
        == [4, 2, 1]
    with pytest.raises(ConfigError, match="trainer.global_batch_size: 32 is not a whole "
                                          r"multiple of world size x batch_size = 3 x 8 = 24"):
        for_world_size(recipe, 3)
    assert for_world_size(_recipe(), 3).config.trainer.grad_accumulation == 1  # without G


def test_the_trainer_alone_refuses_a_k_derived_for_another_world() -> None:
    """Each worker's own check, against its process group (here one process): a recipe whose
    K was derived for 2 ranks (K = 2) reaching a world of 1 (which needs K = 4) is refused
    by the trainer's sampler before training, naming grad_accumulation, G, the world size
    and the batch size; derived for this world it is accepted. Catches a worker trusting
    the K it was handed (a launcher that counted the ranks of its node, not the world,
    would train every update on half of G)."""
    from embodichain.core.data.source import TensorSource
    from embodichain.core.training.batches import rank_sampler

    recipe = _recipe("trainer.global_batch_size=32", "trainer.batch_size=8")
    source = TensorSource({"x": torch.zeros(64, 4), "y": torch.zeros(64, 2)})
    with pytest.raises(UsageError, match=r"trainer.grad_accumulation: 2 disagrees with "
                                         r"trainer.global_batch_size 32 / \(world size 1 x "
                                         r"batch_size 8\) = 4"):
        rank_sampler(for_world_size(recipe, 2).config, source)
    assert rank_sampler(for_world_size(recipe, 1).config, source).share == 32
