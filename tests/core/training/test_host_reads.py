"""R-GPU-1: in the steady state an update never makes the host wait for the device.

Each configuration trains in this process through `build_trainer` + `fit()`. Two things are
watched per update (from the start of one update to the start of the next, so the loop's
own work after it counts too), outside the first updates and the validated or saved ones:

- host reads of tensor values (`.item()`, `.tolist()`, `float()`, `bool()` / `if t:`,
  `.numpy()`, `.cpu()`; tests/support/host_reads.py): none. Catches the strategy's
  `.tolist()` of the totals put back (ddp.py, fsdp.py), a host-side `if skip:` on the
  device's decision, a `float(loss)` in the loop;
- when an update's figures are read: only during the next update (its lagged read), never
  right after it. Catches a loop that reads each update's result at once (the host waiting
  for the device every update, through the pinned copy's event, which no counter of tensor
  reads sees).

On the CPU the host reads the skip decision without waiting for anything, and the learner
does (guarded_step.py): the CPU runs here treat the CPU as a GPU (`HOST_DEVICES` emptied),
so that the ways a GPU skips (the copy, a fused optimizer's `found_inf`) are what is counted;
one test checks the CPU's own way, which reads the decision once per update and nothing else.

On CUDA the same steady state runs under `torch.cuda.set_sync_debug_mode("error")`, which
raises at any synchronising call torch makes (a blocking copy, GradScaler's `.item()`,
indexing a device tensor with host indices): skipped without a CUDA device; run by
benchmarks/gpu_check.sh.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from embodichain.core.training import guarded_step
from embodichain.core.training.learner import Learner
from embodichain.core.training.trainer import SupervisedTrainer
from tests.support.host_reads import HostReads, counting_host_reads, describe
from tests.support.processes import CPU_RECIPE, FACTORIES

UPDATES, LOG_EVERY, CHECK_EVERY = 24, 8, 12
WARM = 3  # the first updates allocate buffers and build the optimizer's state

CONFIGS = {
    "adam": [],
    "sgd momentum, clip, K=2, EMA, bf16": [
        "optimizer.name=sgd", "optimizer.momentum=0.9", "optimizer.grad_clip=1.0",
        "trainer.grad_accumulation=2", "trainer.ema.decay=0.9", "trainer.precision=bf16"],
    "fsdp, adamw, EMA": ["trainer.strategy=fsdp", "optimizer.name=adamw",
                         "trainer.ema.decay=0.9"],
    "fused adamw (found_inf), EMA": ["optimizer.name=adamw", "optimizer.fused=true",
                                     "trainer.ema.decay=0.9"],
    "host-resident source, global batch": [
        "factory=host_resident:build_supervised_trainer", "trainer.global_batch_size=64",
        "trainer.validate_every=0"],
}


def _train(tmp_path: Path, changes: list[str], device: str, monkeypatch: pytest.MonkeyPatch,
           strict_sync: bool = False) -> tuple[dict[int, list[str]], dict[int, int], set[int]]:
    """Train; per update, the host reads it made and the figures read right after it (not
    inside the next update); the updates that are checked."""
    from embodichain.learning.sl import build_trainer, distributed_run, load_recipe

    monkeypatch.syspath_prepend(str(FACTORIES))
    raw = yaml.safe_load(CPU_RECIPE.read_text())
    raw["trainer"]["output_dir"] = str(tmp_path / "run")
    recipe = load_recipe(raw, [f"device={device}", f"trainer.max_updates={UPDATES}",
                               f"trainer.log_every={LOG_EVERY}",
                               f"trainer.validate_every={CHECK_EVERY}",
                               f"trainer.save_every={CHECK_EVERY}", *changes])
    starts: dict[int, int] = {}
    early: dict[int, int] = {}  # update -> figures read outside the next update
    inside = [False]
    trainer = None
    update, settle, fit_update = Learner.update, Learner.settle, SupervisedTrainer._update

    def learner_update(self, *args, **kwargs):
        inside[0] = True
        try:
            return update(self, *args, **kwargs)
        finally:
            inside[0] = False

    def learner_settle(self):
        if self._pending is not None and not inside[0] and trainer is not None:
            early[trainer.step] = early.get(trainer.step, 0) + 1
        return settle(self)

    def trainer_update(self, stop):
        done = self.step + 1  # the update this call makes
        starts[done] = len(reads)
        if strict_sync:
            torch.cuda.set_sync_debug_mode("error" if WARM < done < UPDATES else 0)
        try:
            return fit_update(self, stop)
        finally:
            if strict_sync and not (done % CHECK_EVERY and done < UPDATES):
                # validation and saves after it read the device, as they may
                torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(Learner, "update", learner_update)
    monkeypatch.setattr(Learner, "settle", learner_settle)
    monkeypatch.setattr(SupervisedTrainer, "_update", trainer_update)
    try:
        with counting_host_reads() as reads, distributed_run(recipe.config.device) as dev:
            trainer = build_trainer(recipe, dev)
            trainer.fit(show_progress=False)
    finally:
        if strict_sync:
            torch.cuda.set_sync_debug_mode(0)
    assert trainer.step == UPDATES
    starts[UPDATES + 1] = len(reads)
    per_update = {s: reads.calls[starts[s]:starts[s + 1]] for s in range(1, UPDATES + 1)}
    checked = {s for s in range(WARM + 1, UPDATES)
               if s % CHECK_EVERY and (s - 1) % CHECK_EVERY}
    return per_update, early, checked


def _assert_steady(per_update: dict[int, list[str]], early: dict[int, int],
                   checked: set[int]) -> None:
    reads = {s: calls for s, calls in per_update.items() if s in checked and calls}
    assert not reads, "host reads in the steady state:\n" + "\n".join(
        f"update {s}:\n{describe(HostReads(c))}" for s, c in reads.items())
    logged = {s for s in checked if s % LOG_EVERY == 0}
    assert logged  # a logged update is among those checked: logs read nothing either
    at_once = {s: n for s, n in early.items() if s in checked and s % LOG_EVERY}
    assert not at_once, f"figures read right after their update (the host waited): {at_once}"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_no_host_reads_in_the_steady_state(name: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guarded_step, "HOST_DEVICES", ())  # the CPU skips as a GPU does
    _assert_steady(*_train(tmp_path, CONFIGS[name], "cpu", monkeypatch))


@pytest.mark.parametrize("where", ["cpu", "gpu with skip_guard: sync"])
def test_the_cpu_reads_only_its_skip_decision(where: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU (where it waits for nothing) the skip is read on the host: one read per
    steady update, the guard's, and nothing else; so it is on a GPU (the CPU taken as one)
    with `trainer.skip_guard: sync`. Catches another read hiding behind it, the CPU falling
    back to a device-side guard (no read: its copy is back), and the recipe's key not
    reaching the learner."""
    changes = ["trainer.ema.decay=0.9"]
    if where != "cpu":
        monkeypatch.setattr(guarded_step, "HOST_DEVICES", ())
        changes.append("trainer.skip_guard=sync")
    per_update, early, checked = _train(tmp_path, changes, "cpu", monkeypatch)
    for step in checked:
        assert len(per_update[step]) == 1 and "guarded_step.py" in per_update[step][0] \
            and "tolist" in per_update[step][0], (step, per_update[step])
    assert not {s: n for s, n in early.items() if s in checked and s % LOG_EVERY}


CUDA_CONFIGS = {
    "fp32": [],
    "bf16": ["trainer.precision=bf16"],
    "fp16 with the scaler, K=2, EMA, clip": [
        "trainer.precision=fp16", "trainer.grad_accumulation=2", "trainer.ema.decay=0.9",
        "optimizer.grad_clip=1.0"],
    "fsdp bf16": ["trainer.strategy=fsdp", "trainer.precision=bf16"],
    "host-resident source (prefetched)": ["factory=host_resident:build_supervised_trainer",
                                          "trainer.validate_every=0"],
    "fused adamw (found_inf), EMA": ["optimizer.name=adamw", "optimizer.fused=true",
                                     "trainer.ema.decay=0.9"],
}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(CUDA_CONFIGS))
def test_cuda_steady_state_never_synchronises(name: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """torch raises at the first synchronising call of a steady-state update."""
    if "bf16" in name and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    _assert_steady(*_train(tmp_path, CUDA_CONFIGS[name], "cuda", monkeypatch,
                           strict_sync=True))
