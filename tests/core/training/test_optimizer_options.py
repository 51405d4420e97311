"""R-LOOP-3: optimizer hyper-parameters, `no_decay`, factory `param_groups` with `lr_scale`,
the schedule scaling each group, exact resume, and inspect-checkpoint showing the groups."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from embodichain.core.errors import UsageError
from embodichain.core.recipe.schema import OptimizerConfig, SchedulerConfig
from embodichain.core.runs.config_compat import config_differences
from embodichain.learning.sl import Learner, LossResult
from tests.support import FACTORIES, assert_ok, run_cli, worker_env, write_recipe
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_training_state_equal, comparable_records

CPU = torch.device("cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.backbone(x))))


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    return LossResult(loss=(model(batch["x"]) - batch["y"]).square().mean(), weight=8.0)


def group_names(learner: Learner) -> dict[str, dict]:
    return {g["name"]: g for g in learner.optimizer.param_groups}


def test_hyper_parameters_reach_the_torch_optimizer() -> None:
    """betas and eps (adam, adamw), momentum and nesterov (sgd): catches a key validated but
    never passed on."""
    adam = Learner(Net(), OptimizerConfig(name="adamw", lr=0.01, betas=[0.8, 0.95], eps=1e-6,
                                          weight_decay=0.1), None, 5, CPU)
    group = adam.optimizer.param_groups[0]
    assert isinstance(adam.optimizer, torch.optim.AdamW)
    assert group["betas"] == (0.8, 0.95) and group["eps"] == 1e-6
    assert group["weight_decay"] == 0.1
    sgd = Learner(Net(), OptimizerConfig(name="sgd", lr=0.01, momentum=0.9, nesterov=True),
                  None, 5, CPU)
    group = sgd.optimizer.param_groups[0]
    assert group["momentum"] == 0.9 and group["nesterov"] is True


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_a_fused_optimizer_resumes_exactly_within_itself(name: str) -> None:
    """`optimizer.fused: true` (R-GPU-1's fused option): torch's fused kernel steps, and a
    learner restored from update 3's state continues bitwise as the uninterrupted one.
    Catches the option validated but never passed on (`fused` absent from the torch
    group), and a restore that loses the fused optimizer's state (its step counts live on
    the parameters' device, not the host)."""
    extra = {"momentum": 0.9} if name == "sgd" else {"weight_decay": 0.1}
    config = OptimizerConfig(name=name, lr=0.01, fused=True, **extra)
    schedule = SchedulerConfig(name="cosine", end_lr=0.001, warmup_updates=2)
    g = torch.Generator().manual_seed(4)
    data = [{"x": torch.randn(8, 4, generator=g), "y": torch.randn(8, 2, generator=g)}
            for _ in range(6)]
    full = Learner(Net(), config, schedule, 6, CPU)
    assert all(group["fused"] is True for group in full.optimizer.param_groups)
    for i, batch in enumerate(data):
        full.update(mse, batch)
        if i == 2:
            saved = copy.deepcopy(full.state_dict())
    resumed = Learner(Net(), config, schedule, 6, CPU)
    resumed.load_state_dict(saved)
    for batch in data[3:]:
        resumed.update(mse, batch)
    full.settle(), resumed.settle()
    for (key, a), b in zip(full.model.state_dict().items(),
                           resumed.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    for a, b in zip(full.optimizer.state_dict()["state"].values(),
                    resumed.optimizer.state_dict()["state"].values(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    default = Learner(Net(), OptimizerConfig(name=name, lr=0.01, **extra), None, 6, CPU)
    assert "fused" not in default.optimizer.defaults or not default.optimizer.defaults["fused"]
    for learner in (full, resumed, default):
        learner.release()


def test_changing_fused_on_resume_is_refused() -> None:
    """The fused kernel rounds otherwise than the default arithmetic: a run resumed with
    the other setting would not continue the one it claims to. Catches `optimizer.fused`
    listed among the changes a resume allows."""
    saved = {"optimizer": {"name": "adam", "lr": 0.01, "fused": False}}
    current = {"optimizer": {"name": "adam", "lr": 0.01, "fused": True}}
    assert config_differences(saved, current, 3) == [
        "optimizer.fused: checkpoint False, this run True"]
    older = {"optimizer": {"name": "adam", "lr": 0.01}}  # written before the option existed
    assert config_differences(older, {"optimizer": {"name": "adam", "lr": 0.01,
                                                    "fused": False}}, 3) == []


def test_no_decay_exempts_biases_and_norm_parameters() -> None:
    """`no_decay: [bias, norm]`: every bias and the LayerNorm's weight decay 0, the other
    weights keep the recipe's weight decay; catches an exemption by name only ("norm.weight"
    would be missed for a norm named otherwise) or one that drops parameters."""
    model = Net()
    learner = Learner(model, OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1,
                                             no_decay=["bias", "norm"]), None, 5, CPU)
    groups = group_names(learner)
    assert set(groups) == {"default", "default/no_decay"}
    exempt = {id(p) for p in groups["default/no_decay"]["params"]}
    assert exempt == {id(p) for p in (model.backbone.bias, model.norm.weight, model.norm.bias,
                                      model.head.bias)}
    assert groups["default/no_decay"]["weight_decay"] == 0.0
    assert groups["default"]["weight_decay"] == 0.1
    counted = sum(len(g["params"]) for g in learner.optimizer.param_groups)
    assert counted == len(list(model.parameters()))
    only_bias = Learner(Net(), OptimizerConfig(name="adamw", lr=0.01, weight_decay=0.1,
                                               no_decay=["bias"]), None, 5, CPU)
    assert len(group_names(only_bias)["default/no_decay"]["params"]) == 3


def expected_factor(step: int, warmup: int, end: float, max_updates: int) -> float:
    """Cosine with linear warm-up, written out independently of lr_factor."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (max_updates - warmup))
    return end + (1 - end) * 0.5 * (1 + math.cos(math.pi * progress))


def test_each_group_follows_the_schedule_scaled_by_its_lr_scale() -> None:
    """Per-group learning rates at several steps: base lr x lr_scale x schedule, for a
    backbone at 0.1 with its own weight decay, the rest at 1, each split by no_decay;
    catches a schedule applied to group 0 only or one that resets lr_scale."""
    model = Net()
    lr, end_lr, warmup, max_updates = 0.01, 0.001, 3, 12
    learner = Learner(
        model, OptimizerConfig(name="adamw", lr=lr, weight_decay=0.1, no_decay=["bias"]),
        SchedulerConfig(name="cosine", end_lr=end_lr, warmup_updates=warmup), max_updates, CPU,
        param_groups=[{"name": "backbone", "params": model.backbone.parameters(),
                       "lr_scale": 0.1, "weight_decay": 0.01}])
    groups = group_names(learner)
    assert list(groups) == ["backbone", "backbone/no_decay", "default", "default/no_decay"]
    assert groups["backbone"]["weight_decay"] == 0.01
    assert groups["backbone/no_decay"]["weight_decay"] == 0.0
    g = torch.Generator().manual_seed(2)
    seen = set()
    for step in range(max_updates):
        factor = expected_factor(step, warmup, end_lr / lr, max_updates)
        for name, group in groups.items():
            scale = 0.1 if name.startswith("backbone") else 1.0
            assert group["lr"] == pytest.approx(lr * scale * factor, rel=1e-12), (step, name)
        assert learner.lr == pytest.approx(lr * factor, rel=1e-12)
        seen.add(round(factor, 6))
        learner.update(mse, {"x": torch.randn(8, 4, generator=g),
                             "y": torch.randn(8, 2, generator=g)})
    assert len(seen) > 6  # warm-up and decay both exercised


def test_param_groups_are_checked() -> None:
    model = Net()
    config = OptimizerConfig(name="adam", lr=0.01)
    for groups, text in (
        ([{"params": [torch.zeros(2, requires_grad=True)]}], "not a parameter of the model"),
        ([{"params": [model.head.bias]}, {"params": [model.head.bias]}], "repeats a parameter"),
        ([{"params": [model.head.bias], "lr": 1.0}], "keys are"),
        ([{"params": [model.head.bias], "lr_scale": 0.0}], "lr_scale must be a finite number > 0"),
        ([{"params": [model.head.bias], "lr_scale": "abc"}], "lr_scale must be a number"),
    ):
        # Bad input (exit 2), naming the group: a variant raising ValueError exits 1.
        with pytest.raises(UsageError, match=text):
            Learner(model, config, None, 5, CPU, param_groups=groups)


def factory_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FACTORIES), os.environ.get("PYTHONPATH")) if p)
    return worker_env(PYTHONPATH=path)


@pytest.mark.slow
def test_param_groups_with_no_decay_and_a_schedule_resume_exactly(tmp_path: Path) -> None:
    """A factory group at lr_scale 0.1, no_decay, adamw and a linear schedule with warm-up:
    resuming at 15 of 30 is bitwise the uninterrupted run (param groups with their lrs and
    names included); inspect-checkpoint lists each group."""
    common = {"factory": "grouped:build_supervised_trainer", "trainer.max_updates": 30,
              "trainer.save_every": 15, "trainer.validate_every": 15, "trainer.log_every": 5,
              "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.1,
                            "betas": [0.85, 0.99], "no_decay": ["bias"]},
              "scheduler": {"name": "linear", "end_lr": 0.001, "warmup_updates": 5}}
    env = factory_env()
    full = write_recipe(tmp_path / "full.yaml", tmp_path / "full", **common)
    assert_ok(run_cli("train-sl", "--config", str(full), "--no-progress", env=env))
    resumed = write_recipe(tmp_path / "resumed.yaml", tmp_path / "resumed", **common)
    assert_ok(run_cli("train-sl", "--config", str(resumed), "--no-progress", "--resume",
                      str(tmp_path / "full" / "step_15.pt"), env=env))
    assert assert_training_state_equal(tmp_path / "full" / "last.pt",
                                       tmp_path / "resumed" / "last.pt") > 0
    assert comparable_records(tmp_path / "resumed") == [
        r for r in comparable_records(tmp_path / "full") if r["step"] > 15]
    shown = cli_in_process("inspect-checkpoint", str(tmp_path / "full" / "step_15.pt"), "--json")
    assert_ok(shown)
    groups = json.loads(shown.stdout)["optimizer"]["hyper_parameters"]
    assert [(g["name"], g["parameter_tensors"], g["lr_scale"], g["weight_decay"])
            for g in groups] == [("first", 1, 0.1, 0.5), ("first/no_decay", 1, 0.1, 0.0),
                                 ("default", 1, 1.0, 0.1), ("default/no_decay", 1, 1.0, 0.0)]
    assert groups[0]["lr"] == pytest.approx(0.1 * groups[2]["lr"], rel=1e-12)
    assert groups[0]["betas"] == [0.85, 0.99]
    text = cli_in_process("inspect-checkpoint", str(tmp_path / "full" / "step_15.pt")).stdout
    assert "group 3: name" in text and "default/no_decay" in text


@pytest.mark.parametrize(("changes", "message"), [
    ({"optimizer.momentum": 0.9}, "optimizer.momentum: applies to sgd, not adam"),
    ({"optimizer.betas": [0.9]}, "optimizer.betas"),
    ({"optimizer.betas": [0.9, 1.0]}, "optimizer.betas.1"),
    ({"optimizer.eps": 0.0}, "optimizer.eps"),
    ({"optimizer.no_decay": ["weights"]}, "optimizer.no_decay.0"),
    ({"optimizer.name": "sgd", "optimizer.nesterov": True}, "needs optimizer.momentum > 0"),
    ({"optimizer.name": "sgd", "optimizer.eps": 1.0e-6}, "applies to adam and adamw, not sgd"),
    ({"trainer.grad_accumulation": 0}, "trainer.grad_accumulation"),
    ({"trainer.ema": {"decay": 1.0}}, "trainer.ema.decay"),
    ({"trainer.ema": {"decay": 0.9, "validate": "best"}}, "trainer.ema.validate"),
    ({"trainer.precision": "fp8"}, "trainer.precision"),
    ({"trainer.compile": "yes"}, "trainer.compile"),
    ({"trainer.precision": "fp16"}, "trainer.precision: fp16 needs a CUDA device"),
])
def test_new_keys_are_validated_strictly(tmp_path: Path, changes: dict, message: str) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **changes)
    proc = cli_in_process("validate-config", str(recipe))
    assert proc.returncode == 2 and message in proc.stdout + proc.stderr, proc.stdout + \
        proc.stderr


def test_print_config_shows_every_new_key(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    proc = run_cli("train-sl", "--config", str(recipe), "--print-config")
    assert_ok(proc)
    for key in ("grad_accumulation: 1", "ema: null", "precision: fp32", "compile: false",
                "betas: null", "eps: null", "momentum: null", "nesterov: false", "no_decay: []",
                "fused: false"):
        assert key in proc.stdout, key
    assert not (tmp_path / "run").exists()
