"""R-GPU-1: every way of skipping an update leaves everything as the host-side skip did.

core/training/guarded_step.py has three: on the CPU the decision is read on the host and a
skipped step is not taken (`HostDecidedStep`); on a GPU a fused optimizer gets it as its
`found_inf` (`FoundInfStep`), the others run the step and put back what it must not change
(`CopiedStep`, `trainer.skip_guard: copy`) or read it on the host (`sync`). The device-side
ones run here on the CPU too (`device_side`: the CPU treated as a device the host may not
read), so each is checked without a GPU. Against a hand-written loop that decides on the
host (`if weight == 0 or not finite: no step, no EMA`), over updates with zero weight and
with a non-finite loss among normal ones, for Adam, AdamW and SGD with momentum, with
clipping and an EMA: parameters, optimizer state (moments and step counts; no state at all
after a skipped first update), schedule and EMA are bitwise equal after every update.

Catches: the optimizer state of a skipped step not restored (Adam's step count or moments
advanced), the state a skipped first step created left behind, the parameters not selected
back, the EMA moved on a skipped update, a guarded step whose arithmetic differs, and a
guard that copies where it need not (on the CPU, or for a fused optimizer).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from embodichain.core.recipe.schema import OptimizerConfig, SchedulerConfig
from embodichain.core.training import guarded_step
from embodichain.core.training.ema import Ema
from embodichain.core.training.learner import Learner
from embodichain.core.training.param_groups import build_optimizer, build_param_groups

CPU = torch.device("cpu")
# weight 0 first (state a skipped first step creates), then normal, zero and non-finite
PLAN = ["zero", "ok", "ok", "zero", "ok", "nan", "ok", "inf", "ok", "ok"]


def objective(model: nn.Module, batch: dict[str, torch.Tensor]):
    from embodichain.learning.sl import LossResult

    loss = (model(batch["x"]) - batch["y"]).square().mean() * batch["scale"]
    return LossResult(loss=loss, weight=batch["weight"])


def batch(kind: str, g: torch.Generator, device: torch.device = CPU
          ) -> dict[str, torch.Tensor]:
    data = {"x": torch.randn(8, 4, generator=g), "y": torch.randn(8, 2, generator=g),
            "weight": torch.tensor(0.0 if kind == "zero" else 8.0),
            "scale": torch.tensor({"nan": float("nan"), "inf": float("inf")}.get(kind, 1.0))}
    return {k: v.to(device) for k, v in data.items()}


def make_model(norm: bool = True) -> nn.Module:
    """`norm`: with BatchNorm, buffers that every forward changes (a skipped update's too)
    and that the EMA copies on applied updates only."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16) if norm else nn.Identity(),
                         nn.Tanh(), nn.Linear(16, 2))


def assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a} != {b}"


GUARDS = {"host": guarded_step.HostDecidedStep, "sync": guarded_step.HostDecidedStep,
          "found_inf": guarded_step.FoundInfStep, "copy": guarded_step.CopiedStep}
CONFIGS = {
    "adam+clip": OptimizerConfig(name="adam", lr=0.01, grad_clip=0.5),
    "adamw": OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1),
    "sgd-nesterov": OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, nesterov=True),
    "sgd": OptimizerConfig(name="sgd", lr=0.05),
    "adamw-fused": OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1, fused=True),
    "sgd-fused": OptimizerConfig(name="sgd", lr=0.05, momentum=0.9, fused=True),
}
# Each optimizer under the CPU's guard and under those a GPU would give it.
CASES = [(name, guard) for name, config in CONFIGS.items()
         for guard in ("host", *(("found_inf",) if config.fused else ("copy", "sync")))]


@pytest.fixture
def device_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU treated as a GPU: the skip applied without reading the decision."""
    monkeypatch.setattr(guarded_step, "HOST_DEVICES", ())


@pytest.mark.parametrize(("name", "guard"), CASES, ids=[f"{n}/{g}" for n, g in CASES])
def test_device_skip_equals_the_host_skip(name: str, guard: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if guard != "host":
        monkeypatch.setattr(guarded_step, "HOST_DEVICES", ())
    check_against_the_host_skip(CONFIGS[name], guard, CPU)


CUDA_CASES = [("adam+clip", "copy"), ("adam+clip", "sync"), ("adamw-fused", "found_inf"),
              ("sgd-fused", "found_inf")]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("name", "guard"), CUDA_CASES, ids=[f"{n}/{g}" for n, g in CUDA_CASES])
def test_each_cuda_guard_equals_the_host_skip(name: str, guard: str) -> None:
    """On a GPU: the guard each optimizer gets (fused: found_inf; else the recipe's copy or
    sync) is bitwise the loop deciding on the host."""
    check_against_the_host_skip(CONFIGS[name], guard, torch.device("cuda"))


def check_against_the_host_skip(config: OptimizerConfig, guard: str,
                                device: torch.device) -> None:
    schedule = SchedulerConfig(name="cosine", end_lr=0.001, warmup_updates=2)
    learner = Learner(make_model(), config, schedule, len(PLAN), device, ema_decay=0.8,
                      skip_guard="sync" if guard == "sync" else "copy")
    assert type(learner._guard) is GUARDS[guard]
    # The reference: today's loop, deciding on the host.
    model = make_model().to(device)
    optimizer = build_optimizer(build_param_groups(model, config), config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learner._lr_factor)
    ema = Ema(model, 0.8)
    g_learner, g_reference = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for step, kind in enumerate(PLAN, 1):
        result = learner.update(objective, batch(kind, g_learner, device))
        data = batch(kind, g_reference, device)
        out = objective(model, data)
        (out.loss * out.weight).backward()
        weight = float(out.weight)
        skip = weight == 0 or not torch.isfinite(out.loss).item()
        if not skip:
            for p in model.parameters():
                p.grad.div_(weight)
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            ema.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        assert result.skipped == skip and result.nonfinite == (kind in ("nan", "inf"))
        where = f"update {step} ({kind})"
        assert_same(learner.model.state_dict(), model.state_dict(), f"{where} model")
        assert_same(learner.optimizer.state_dict(), optimizer.state_dict(),
                    f"{where} optimizer")
        assert_same(learner.scheduler.state_dict(), scheduler.state_dict(), f"{where} schedule")
        assert_same(learner.ema.state_dict(), ema.state_dict(), f"{where} EMA")
    assert any(not torch.equal(a.cpu(), b) for a, b in zip(
        learner.model.state_dict().values(), make_model().state_dict().values(), strict=True))
    learner.release()


@pytest.mark.parametrize("fused", [False, True], ids=["copy", "found_inf"])
def test_a_lagged_settle_restores_before_the_next_step(fused: bool, device_side: None) -> None:
    """Two updates in a row without reading the first one's figures: the second settles
    the first (a skipped one's Adam state put back) before it steps."""
    config = OptimizerConfig(name="adam", lr=0.01, fused=fused)
    learner = Learner(make_model(), config, None, 4, CPU, ema_decay=0.8)
    g = torch.Generator().manual_seed(3)
    learner.update(objective, batch("ok", g))
    learner.settle()
    state = copy.deepcopy(learner.optimizer.state_dict())
    reference = Ema(learner.model, 0.8)  # the EMA as it is, moved once more by hand
    reference.load_state_dict(learner.ema.state_dict())
    first = learner.update(objective, batch("nan", g))
    assert not first.settled
    second = learner.update(objective, batch("ok", g))
    assert first.settled and first.skipped and not second.settled
    steps = {int(s["step"]) for s in learner.optimizer.state_dict()["state"].values()}
    assert steps == {int(s["step"]) + 1 for s in state["state"].values()}  # one step, not two
    learner.settle()
    reference.update()  # one average, from the parameters after the second update's step
    assert_same(learner.ema.state_dict(), reference.state_dict(), "EMA")
    learner.release()


def _full(value):
    """A state's tensors as plain ones (FSDP's are DTensors: gathered, one rank here)."""
    if isinstance(value, dict):
        return {k: _full(v) for k, v in value.items()}
    if hasattr(value, "full_tensor"):
        return value.full_tensor().clone()  # one rank: may be the shard itself
    return value.clone() if isinstance(value, torch.Tensor) else copy.deepcopy(value)


@pytest.mark.parametrize("fused", [False, True], ids=["copy", "found_inf"])
def test_fsdp_skips_leave_its_shards_and_state_as_they_were(fused: bool, device_side: None
                                                            ) -> None:
    """Under FSDP (one rank) the device-side skip works on the local shards: a skipped
    update leaves parameters, Adam's state and the sharded EMA bitwise as they were; a
    normal one changes them."""
    learner = Learner(make_model(norm=False), OptimizerConfig(name="adam", lr=0.01, fused=fused),
                      None, len(PLAN), CPU, strategy="fsdp", ema_decay=0.8)
    assert type(learner._guard) is GUARDS["found_inf" if fused else "copy"]
    g = torch.Generator().manual_seed(5)
    try:
        for step, kind in enumerate(PLAN, 1):
            learner.settle()
            before = (_full(learner.model.state_dict()),
                      _full(learner.optimizer.state_dict()["state"]),
                      _full(learner.ema.state_dict()))
            result = learner.update(objective, batch(kind, g)).settle()
            after = (_full(learner.model.state_dict()),
                     _full(learner.optimizer.state_dict()["state"]),
                     _full(learner.ema.state_dict()))
            if result.skipped:
                assert_same(after, before, f"update {step} ({kind})")
            else:
                assert not torch.equal(after[0]["0.weight"], before[0]["0.weight"]), step
    finally:
        learner.release()


@pytest.mark.parametrize(("fused", "device", "kept"), [
    (False, "host", "nothing"), (True, "host", "nothing"), (True, "gpu", "nothing"),
    (False, "gpu", "parameters and state")],
    ids=["cpu", "cpu-fused", "found_inf", "copy"])
def test_only_the_copy_guard_copies(fused: bool, device: str, kept: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What the guard copies per update, counted in elements: nothing on the CPU or for a
    fused optimizer (catches the per-update copy of parameters, moments and EMA coming back
    there, the 600 MB the benchmark measured on a 50 M-parameter model); with
    `skip_guard: copy`, the parameters and Adam's state, and not the EMA."""
    if device == "gpu":
        monkeypatch.setattr(guarded_step, "HOST_DEVICES", ())
    copied: list[int] = []
    real = guarded_step._copy
    monkeypatch.setattr(guarded_step, "_copy", lambda dst, src: (
        copied.append(sum(t.numel() for t in src)), real(dst, src)))
    model = make_model(norm=False)  # no buffers
    learner = Learner(model, OptimizerConfig(name="adam", lr=0.01, fused=fused), None, 4, CPU,
                      ema_decay=0.8)
    g = torch.Generator().manual_seed(2)
    for kind in ("ok", "ok", "nan", "ok"):
        learner.update(objective, batch(kind, g)).settle()
    params = sum(p.numel() for p in model.parameters())
    state = 2 * params + len(list(model.parameters()))  # Adam: two moments, a step count
    copied = [n for n in copied if n]
    # copy: the parameters (and no state yet) at the first update, then the state and the
    # parameters at each, and the state restored after the skipped one
    assert copied == ([] if kept == "nothing" else
                      [params, state, params, state, params, state, state, params]), copied
    learner.release()
