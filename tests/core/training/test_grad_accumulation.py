"""R-LOOP-1: `trainer.grad_accumulation: K` — the update over K micro-batches of every rank is
the one-process update on their union, with one all-reduce per update, exact on resume.

Real torchrun, 2 gloo workers: the train-sl runs use the sl_ddp example; the float64
rebuild and the collective count use tests/scripts/accumulated_update.py (the real Learner,
sampler and micro-batch split).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.runs.resume_policy import config_differences
from tests.support import SCRIPTS, assert_ok, run_cli, run_torchrun, worker_env, write_recipe
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_training_state_equal, comparable_records

LR = 0.1  # accumulated_update.py's SGD learning rate


def train(tmp_path: Path, name: str, nproc: int = 2, *extra: str, **changes) -> Path:
    recipe = write_recipe(tmp_path / f"{name}.yaml", tmp_path / name, **changes)
    launch = run_torchrun if nproc > 1 else run_cli
    assert_ok(launch("train-sl", "--config", str(recipe), "--no-progress", *extra))
    return tmp_path / name


def model_state(run: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return read_checkpoint(run / name)["payload"]["learner"]["model"]


@pytest.fixture(scope="module")
def k4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example recipe (200 updates, snapshots at 100 and 200) by 2 torchrun workers with
    micro-batches of 8 and K = 4: the same examples per update as its batch of 32."""
    return train(tmp_path_factory.mktemp("k4"), "k4", **{"trainer.batch_size": 8,
                                                         "trainer.grad_accumulation": 4})


@pytest.mark.slow
def test_k4_batch_8_equals_k1_batch_32_over_200_updates(k4: Path, sl_ddp_two_workers: Path
                                                        ) -> None:
    """Same examples (each rank draws its 32 indices per update in order, cut into 4
    micro-batches of 8), same update; catches accumulation that draws each micro-batch
    afresh, averages per micro-batch, or divides by K. Only the summation order differs
    (4 partial sums added instead of one sum of 32), so the parameters after 200 Adam
    updates agree to float32 rounding, 1e-5 relative, not bitwise. K = 1 is the shared
    run of the same recipe with batches of 32 (conftest's `sl_ddp_two_workers`)."""
    k1 = sl_ddp_two_workers
    a, b = model_state(k4), model_state(k1)
    for name in b:
        scale = b[name].abs().max().item()
        assert (a[name] - b[name]).abs().max().item() <= 1e-5 * scale, name
    # Not vacuous: the runs learned (the loss halved), and agree update by update.
    loss_k4 = [r["train/loss"] for r in comparable_records(k4) if "train/loss" in r]
    loss_k1 = [r["train/loss"] for r in comparable_records(k1) if "train/loss" in r]
    assert len(loss_k1) == 20
    assert loss_k4 == pytest.approx(loss_k1, rel=1e-5) and loss_k1[-1] < 0.5 * loss_k1[0]


@pytest.fixture(scope="module")
def accumulated(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("accumulated_update")
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    assert_ok(run_torchrun(str(out), module="accumulated_update",
                           env=worker_env(PYTHONPATH=path)))
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def rebuild(before: dict[str, torch.Tensor], micro: list[list[dict[str, torch.Tensor]]],
            divide_by_k: bool = False) -> dict[str, torch.Tensor]:
    """The one-process float64 SGD update on the union of every rank's micro-batches:
    grad of sum_{r,k}(sum of masked squared errors) / sum_{r,k}(mask.sum()). With
    `divide_by_k`, the broken variant: the mean over k of each micro-step's global mean."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = model.double()
    model.load_state_dict({n: t.double() for n, t in before.items()})
    batches = [b for rank in micro for b in rank]
    sums = [((model(b["x"].double()) - b["y"].double()).square() * b["mask"].double()).sum()
            for b in batches]
    weights = [b["mask"].double().sum() for b in batches]
    if divide_by_k:
        k_count = len(micro[0])
        per_k = [sum(sums[r * k_count + k] for r in range(len(micro)))
                 / sum(weights[r * k_count + k] for r in range(len(micro))).clamp_min(1)
                 for k in range(k_count)]
        loss = sum(per_k) / k_count
    else:
        loss = sum(sums) / sum(weights)
    loss.backward()
    with torch.no_grad():
        return {n: p - LR * p.grad for n, p in model.named_parameters()}


@pytest.mark.slow
def test_float64_rebuild_of_accumulated_updates_catches_dividing_by_k(accumulated) -> None:
    """Each rank's update equals a float64 one-process rebuild from the micro-batches every
    rank drew (rank-uneven masks, one zero-weight micro-batch) to 1e-6; the broken variant
    that averages per micro-batch and divides by K (the 2024 HF transformers bug) is off by
    far more. A zero-weight update (every micro-batch of every rank) is skipped."""
    r0, r1 = accumulated
    assert len(r0["micro"][0]) == 3 and all(len(m) == 3 for m in r1["micro"])
    assert r0["micro"][1][1]["mask"].sum() == 0 and r1["micro"][1][1]["mask"].sum() > 0
    updates = len(r0["before"])
    checked = 0
    for u in range(updates):
        after = r0["before"][u + 1] if u + 1 < updates else r0["after"]
        other = r1["before"][u + 1] if u + 1 < updates else r1["after"]
        for name in after:  # identical on both ranks
            assert torch.equal(after[name], other[name]), (u, name)
        if r0["summaries"][u]["skipped"]:
            assert u == 2 and r0["summaries"][u]["weight"] == 0.0
            for name in after:
                assert torch.equal(after[name], r0["before"][u][name])
            continue
        expected = rebuild(r0["before"][u], [r0["micro"][u], r1["micro"][u]])
        broken = rebuild(r0["before"][u], [r0["micro"][u], r1["micro"][u]], divide_by_k=True)
        gap = max((broken[n] - expected[n]).abs().max().item() for n in expected)
        assert gap > 1e-4, "the broken variant is indistinguishable here"
        for name in expected:
            diff = (after[name].double() - expected[name]).abs().max().item()
            assert diff <= 1e-6, (u, name, diff)
        weight = sum(b["mask"].sum().item() for rank in (r0, r1) for b in rank["micro"][u])
        assert r0["summaries"][u]["weight"] == weight
        checked += 1
    assert checked == updates - 1


@pytest.mark.slow
def test_one_allreduce_per_update_not_one_per_micro_batch(accumulated) -> None:
    """The gradient all-reduce (which also carries weight, loss, metrics and the stop flag)
    runs once per bucket per update whatever K: catches an all-reduce per micro-batch
    (no `no_sync`), which would count K times as many."""
    for rank in accumulated:
        buckets = rank["k1_allreduce_calls"]
        assert buckets >= 1
        assert rank["allreduce_calls"] == [buckets] * len(rank["before"])


@pytest.mark.slow
def test_resume_mid_run_with_k4_is_bitwise(k4: Path, tmp_path: Path) -> None:
    """Resuming at update 100 of 200 with K = 4 gives the uninterrupted run, bitwise: catches
    a sampler position counted in micro-batches, or a resume that redraws part of an update."""
    common = {"trainer.batch_size": 8, "trainer.grad_accumulation": 4}
    recipe = write_recipe(tmp_path / "resumed.yaml", tmp_path / "resumed", **common)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           "--resume", str(k4 / "step_100.pt")))
    assert assert_training_state_equal(k4 / "last.pt", tmp_path / "resumed" / "last.pt") > 0
    after = [r for r in comparable_records(k4) if r["step"] > 100]
    assert comparable_records(tmp_path / "resumed") == after
    # Changing K refuses the resume, naming the key (training configuration, R-RESUME-2).
    changed = write_recipe(tmp_path / "k2.yaml", tmp_path / "k2",
                           **{**common, "trainer.grad_accumulation": 2})
    proc = cli_in_process("inspect-checkpoint", str(k4 / "step_100.pt"), "--config", str(changed))
    assert proc.returncode == 1 and "trainer.grad_accumulation: checkpoint 4, this run 2" \
        in proc.stdout + proc.stderr


def test_checkpoints_from_before_the_new_keys_still_resume() -> None:
    """A recipe saved before this release's keys (R-LOOP, §11 sampling, early stop, background
    saves) existed compares as their defaults; catches a new key making every older
    checkpoint unresumable (trainer.sampling and trainer.early_stop did)."""
    current = FrameworkConfig.model_validate({
        "factory": "sl_ddp", "trainer": {"batch_size": 4, "max_updates": 5, "output_dir": "o"},
        "optimizer": {"name": "adam", "lr": 0.001}}).model_dump(mode="json")
    saved = {**current, "trainer": {k: v for k, v in current["trainer"].items()
                                    if k not in ("grad_accumulation", "ema", "precision",
                                                 "compile", "sampling", "early_stop", "best",
                                                 "async_save", "save_every_s",
                                                 "data_workers", "prefetch", "strategy",
                                                 "fsdp")},
             "optimizer": {"name": "adam", "lr": 0.001, "weight_decay": 0.0,
                           "grad_clip": None}}
    assert config_differences(saved, current, 0) == []
    accumulating = {**current, "trainer": {**current["trainer"], "grad_accumulation": 2}}
    assert config_differences(saved, accumulating, 0) == [
        "trainer.grad_accumulation: checkpoint 1, this run 2"]
