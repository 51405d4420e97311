"""R-DIST-3: one update represents sum_r(w_r*l_r) / sum_r(w_r) exactly; zero weight skips.

The 2-worker side runs the real Learner (DDP + the weighted comm hook) under torchrun through
tests/scripts/weighted_update.py; the single-process side runs the same Learner here, in the
test process (no process group), and a hand-written autograd update is the ground truth.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.data.samplers import ReplacementSampler
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.core.runs.run_dir import read_metrics
from tests.support import TESTS, assert_ok, run_torchrun, worker_env, write_recipe

SCRIPTS = TESTS / "scripts"
EPS = torch.finfo(torch.float32).eps
LR = 0.1
CPU = torch.device("cpu")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_embodichain_test_{name}",
                                                  SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


wu = _load("weighted_update")


def scripts_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    return worker_env(PYTHONPATH=path)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("weighted_update")
    assert_ok(run_torchrun(str(out), module="weighted_update", env=scripts_env()))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def reference_sgd(data: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], float]:
    """Plain autograd on the union batch: the global masked mean, then p - lr * grad."""
    model = wu.make_model()
    squared = (model(data["x"]) - data["y"]).square() * data["mask"]
    loss = squared.sum() / data["mask"].sum()
    loss.backward()
    with torch.no_grad():
        return {n: p - LR * p.grad for n, p in model.named_parameters()}, loss.item()


def naive_ddp_sgd(data: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What plain DDP gradient averaging would do: the mean of the two ranks' local means."""
    model = wu.make_model()
    losses = [wu.masked_mse(model, wu.local_batch(data, r, 2)).loss for r in (0, 1)]
    (sum(losses) / 2).backward()
    with torch.no_grad():
        return {n: p - LR * p.grad for n, p in model.named_parameters()}


def tolerance(expected: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Per-element bound for `p - lr*g` computed with a different summation order.

    The 2-worker gradient is (sum of rank 0's 10 terms) + (sum of rank 1's 4 terms), added by
    the all-reduce, then divided by 14; the reference sums all 14 terms in one order. Float
    addition is not associative, so g may differ by a few units in its last place: at most
    ~14 eps relative to the step lr*g (= after - before). Subtracting it from p then rounds
    to the nearest float, which adds at most 1 ulp of the result (eps * |p| >= 1 ulp).
    Measured here: differences of 0-1 ulp of p where the step is small against p, and up to
    a few ulps of p where p itself is tiny (the error is then on the scale of the step); the
    largest is 0.42 of this bound. An update weighted wrongly (plain DDP averaging) is off by
    thousands of times the bound (asserted below), so the check cannot pass by accident.
    """
    return 2 * EPS * expected.abs() + 16 * EPS * (expected - before).abs()


def assert_same_update(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                       before: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        diff = (actual[name] - expected[name]).abs()
        bound = tolerance(expected[name], before[name])
        assert bool((diff <= bound).all()), (
            f"{name}: max difference {diff.max().item():.3e} exceeds the rounding bound "
            f"(max {bound.max().item():.3e})")


@pytest.mark.slow
def test_two_ranks_with_unequal_weights_equal_the_union_batch_update(two_workers):
    rank0, rank1 = (r["sgd"] for r in two_workers)
    data = wu.table()
    expected, loss = reference_sgd(data)
    before = rank0["before"]
    # Every rank ends with bitwise the same parameters: the same reduced gradient everywhere.
    for name in rank0["after"]:
        assert torch.equal(rank0["after"][name], rank1["after"][name]), name
        assert torch.equal(rank0["before"][name], rank1["before"][name]), name
    assert_same_update(rank0["after"], expected, before)
    # The update summary is the global weighted loss, not rank 0's local one.
    assert rank0["summary"]["weight"] == rank1["summary"]["weight"] == 14.0
    assert rank0["summary"]["loss"] == rank1["summary"]["loss"]
    assert math.isclose(rank0["summary"]["loss"], loss, rel_tol=1e-6)
    local0 = wu.masked_mse(wu.make_model(), wu.local_batch(data, 0, 2)).loss.item()
    assert not math.isclose(rank0["summary"]["loss"], local0, rel_tol=1e-3)
    assert rank0["summary"]["skipped"] == 0.0


@pytest.mark.slow
def test_the_bound_separates_weighted_from_plain_ddp_averaging(two_workers):
    data = wu.table()
    expected, _ = reference_sgd(data)
    naive = naive_ddp_sgd(data)
    before = two_workers[0]["sgd"]["before"]
    gap = max(((naive[n] - expected[n]).abs() / tolerance(expected[n], before[n])).max().item()
              for n in expected)
    assert gap > 1000, f"plain averaging is only {gap:.0f}x the tolerance away"


def test_single_process_learner_equals_the_union_batch_update():
    result = wu.one_update(OptimizerConfig(name="sgd", lr=LR), wu.table(), 0, 1, CPU)
    expected, loss = reference_sgd(wu.table())
    assert_same_update(result["after"], expected, result["before"])
    assert result["summary"]["weight"] == 14.0
    assert math.isclose(result["summary"]["loss"], loss, rel_tol=1e-6)


@pytest.mark.slow
def test_a_rank_without_valid_targets_contributes_nothing(two_workers):
    data = wu.table()
    data["mask"][6:] = 0  # rank 1's rows carry no supervision
    expected, loss = reference_sgd(data)
    rank0, rank1 = (r["sgd_one_rank_empty"] for r in two_workers)
    for name in rank0["after"]:
        assert torch.equal(rank0["after"][name], rank1["after"][name]), name
    assert_same_update(rank0["after"], expected, rank0["before"])
    assert rank0["summary"]["weight"] == 10.0
    assert math.isclose(rank0["summary"]["loss"], loss, rel_tol=1e-6)


def _assert_zero_weight_skipped(result: dict) -> None:
    for name, before in result["before"].items():
        assert torch.equal(result["after"][name], before), f"{name} moved on zero weight"
    # Not vacuous: this Adam has momentum and would have moved them on zero gradients.
    assert any(not torch.equal(result["adam_on_zero_grads"][n], b)
               for n, b in result["before"].items())
    assert result["adam_steps_after"] == result["adam_steps_before"]
    assert result["summary"]["skipped"] == 1.0
    assert result["summary"]["weight"] == 0.0
    assert result["scheduler_epoch"] == 2  # counted as an update: the schedule advanced


@pytest.mark.slow
def test_zero_total_weight_skips_the_step_on_every_rank(two_workers):
    for rank in two_workers:
        _assert_zero_weight_skipped(rank["adam_zero_weight"])


def test_zero_total_weight_skips_the_step_in_one_process():
    _assert_zero_weight_skipped(wu.zero_weight_with_adam(wu.table(), 0, 1, CPU))


@pytest.mark.slow
def test_trainer_records_skipped_updates_and_counts_them(tmp_path: Path):
    """2 workers, one example each, half the corpus unsupervised: some global batches weigh 0."""
    zw = _load("zero_weight_factory")
    max_updates = 16
    out = tmp_path / "run"
    recipe = write_recipe(tmp_path / "zero.yaml", out, **{
        "factory": "zero_weight_factory:build_supervised_trainer",
        "trainer.batch_size": 1, "trainer.max_updates": max_updates, "trainer.log_every": 1,
        "trainer.validate_every": 0, "trainer.save_every": 1,
    })
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=scripts_env())
    assert_ok(proc)

    # Which updates have zero total weight follows from the corpus and the per-rank streams.
    mask = zw.corpus(4096, 1234)["mask"]
    samplers = [ReplacementSampler(4096, 1, 0, rank) for rank in (0, 1)]
    weights = {step: sum(mask[s.next_indices()].sum().item() for s in samplers)
               for step in range(1, max_updates + 1)}
    expected = {step for step, w in weights.items() if w == 0}
    assert expected and len(expected) < max_updates and min(expected) > 1  # a useful draw

    records = read_metrics(out / "metrics.jsonl").records
    assert {r["step"] for r in records if r.get("train/skipped") == 1} == expected
    weight_at = {r["step"]: r["train/weight"] for r in records if "train/weight" in r}
    assert weight_at == weights  # global weight, logged at every update

    last = read_checkpoint(out / "last.pt")["payload"]
    assert last["run"]["step"] == max_updates
    for step in expected:
        now = read_checkpoint(out / f"step_{step}.pt")["payload"]["learner"]
        prev = read_checkpoint(out / f"step_{step - 1}.pt")["payload"]["learner"]
        for name, tensor in now["model"].items():
            assert torch.equal(tensor, prev["model"][name]), f"{name} moved at update {step}"
        for key, state in now["optimizer"]["state"].items():  # Adam's moments and step too
            for field, value in state.items():
                assert torch.equal(value, prev["optimizer"]["state"][key][field]), (key, field)
        assert now["scheduler"]["last_epoch"] == step  # the skipped update still counted
