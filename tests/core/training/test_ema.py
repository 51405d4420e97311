"""R-LOOP-2: `trainer.ema` — the average after N steps is the hand-computed one, it is
checkpointed and restored (resume exact), validated as chosen, and shown by inspect."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.core.training.ema import Ema
from embodichain.learning.sl import Learner, LossResult
from embodichain.plugins.sl_ddp import make_corpus, make_model, masked_mse, validation_seed
from tests.support import assert_ok, run_cli, run_torchrun, write_recipe
from tests.support.cli import cli_in_process
from tests.support.state_compare import assert_training_state_equal, comparable_records

CPU = torch.device("cpu")
DECAY = 0.9


def batchnorm_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> LossResult:
    loss = (model(batch["x"]) - batch["y"]).square().mean()
    return LossResult(loss=loss, weight=float(batch["x"].shape[0]))


def test_ema_after_n_steps_equals_the_hand_computed_average() -> None:
    """ema_0 = the initial parameters, ema_t = decay * ema_{t-1} + (1 - decay) * p_t after each
    optimizer step (float64 reference); buffers are copies of the model's. Catches an EMA
    updated before the step, with the decay on the wrong side, or buffers averaged."""
    learner = Learner(batchnorm_model(), OptimizerConfig(name="adam", lr=0.05), None, 20, CPU,
                      ema_decay=DECAY)
    reference = {n: p.detach().double().clone() for n, p in learner.model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    for _ in range(12):
        batch = {"x": torch.randn(16, 4, generator=g), "y": torch.randn(16, 2, generator=g)}
        learner.update(mse, batch)
        for n, p in learner.model.named_parameters():
            reference[n] = DECAY * reference[n] + (1 - DECAY) * p.detach().double()
    averaged = dict(learner.ema.model.named_parameters())
    for name, expected in reference.items():
        assert (averaged[name].double() - expected).abs().max().item() <= 1e-6, name
        # Not vacuous: the average lags the model.
        assert not torch.equal(averaged[name], dict(learner.model.named_parameters())[name])
    for (name, mine), (_, theirs) in zip(learner.ema.model.named_buffers(),
                                         learner.model.named_buffers(), strict=True):
        assert torch.equal(mine, theirs), name
    # The state is a plain model state dict: it loads into the model class (export).
    exported = batchnorm_model()
    exported.load_state_dict(learner.state_dict()["ema"])


def test_ema_update_is_one_foreach_call_not_a_python_loop(monkeypatch) -> None:
    """The parameters move in one `torch._foreach_lerp_` over all of them."""
    ema = Ema(batchnorm_model(), DECAY)
    calls = []
    real = torch._foreach_lerp_
    monkeypatch.setattr(torch, "_foreach_lerp_", lambda *a: calls.append(len(a[0])) or real(*a))
    ema.update()
    assert calls == [len(list(ema.model.parameters()))]


@pytest.mark.slow
def test_resume_with_ema_is_exact_and_catches_an_ema_not_restored(tmp_path: Path) -> None:
    """2 workers, `validate: both`: resuming at 20 of 40 gives the uninterrupted run's model,
    optimizer and EMA bitwise. An EMA that is not restored (restarted from the resumed model)
    differs: at update 20 the average is far from the model. Validation reports the model as
    validation/* and the EMA as validation_ema/*, computed from exactly the saved weights."""
    common = {"trainer.max_updates": 40, "trainer.save_every": 20, "trainer.validate_every": 20,
              "trainer.log_every": 10, "trainer.ema": {"decay": DECAY, "validate": "both"}}
    full = write_recipe(tmp_path / "full.yaml", tmp_path / "full", **common)
    assert_ok(run_torchrun("train-sl", "--config", str(full), "--no-progress"))
    resumed = write_recipe(tmp_path / "resumed.yaml", tmp_path / "resumed", **common)
    assert_ok(run_torchrun("train-sl", "--config", str(resumed), "--no-progress",
                           "--resume", str(tmp_path / "full" / "step_20.pt")))
    assert assert_training_state_equal(tmp_path / "full" / "last.pt",
                                       tmp_path / "resumed" / "last.pt") > 0
    assert comparable_records(tmp_path / "resumed") == [
        r for r in comparable_records(tmp_path / "full") if r["step"] > 20]

    at_20 = read_checkpoint(tmp_path / "full" / "step_20.pt")["payload"]["learner"]
    gap = (at_20["ema"]["0.weight"] - at_20["model"]["0.weight"]).abs().max().item()
    assert gap > 1e-3, "an EMA restarted from the model would be indistinguishable"

    last = read_checkpoint(tmp_path / "full" / "last.pt")["payload"]["learner"]
    validation = make_corpus(1024, validation_seed(1234))
    record = [r for r in comparable_records(tmp_path / "full") if r["step"] == 40
              and "validation/mse" in r][0]
    for key, weights in (("validation/mse", last["model"]), ("validation_ema/mse", last["ema"])):
        model = make_model(32)
        model.load_state_dict(weights)
        with torch.no_grad():
            assert record[key] == masked_mse(model.eval(), validation).loss.item(), key
    assert record["validation/mse"] != record["validation_ema/mse"]

    shown = cli_in_process("inspect-checkpoint", str(tmp_path / "full" / "last.pt"), "--json")
    assert_ok(shown)
    ema = json.loads(shown.stdout)["ema"]
    assert ema == {"decay": DECAY, "validate": "both", "tensors": 4, "bytes": (4 * 32 + 32
                                                                               + 32 * 2 + 2) * 4}
    assert "EMA weights" in cli_in_process("inspect-checkpoint",
                                    str(tmp_path / "full" / "last.pt")).stdout
    # `validate` may change on resume; the decay may not (training configuration).
    other = write_recipe(tmp_path / "other.yaml", tmp_path / "other", **{
        **common, "trainer.ema": {"decay": 0.5, "validate": "model"}})
    proc = cli_in_process("inspect-checkpoint", str(tmp_path / "full" / "step_20.pt"),
                   "--config", str(other))
    assert proc.returncode == 1
    assert "trainer.ema.decay: checkpoint 0.9, this run 0.5" in proc.stdout
    assert "trainer.ema.validate" not in proc.stdout


def test_validate_ema_reports_the_average_as_validation(tmp_path: Path) -> None:
    """`validate: ema` (the default) evaluates the EMA weights under validation/*; catches
    validation of the raw model when the EMA was asked for."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **{
        "trainer.max_updates": 10, "trainer.validate_every": 10, "trainer.save_every": 0,
        "trainer.ema": {"decay": 0.5}})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    last = read_checkpoint(tmp_path / "run" / "last.pt")["payload"]["learner"]
    record = [r for r in comparable_records(tmp_path / "run") if "validation/mse" in r][0]
    assert not any(k.startswith("validation_ema/") for k in record)
    model = make_model(32)
    model.load_state_dict(last["ema"])
    with torch.no_grad():
        expected = masked_mse(model.eval(), make_corpus(1024, validation_seed(1234))).loss
    assert record["validation/mse"] == expected.item()


class ChunkPolicy(nn.Module):
    """A model with a method beyond `forward` that a policy calls (as ALOHA's `act_chunk`)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def act_chunk(self, x: torch.Tensor) -> torch.Tensor:
        return self(x) * self.scale


@pytest.mark.parametrize("kind", ["Ema", "ShardedEma"])
def test_the_emas_weights_act_in_a_module_of_the_models_class(kind: str) -> None:
    """`run_closed_loop` with `acting: ema` (DDP's Ema, FSDP's ShardedEma on the model it
    averages), under a strategy whose forward is collective. Catches: the policy given the
    sharded EMA's call-only view (no `act_chunk`: ALOHA's crash under fsdp), the model's own
    weights acting, the model not holding its own weights again afterwards, and ranks not
    stepping in lockstep although the strategy's forward is collective."""
    from types import SimpleNamespace

    from embodichain.core.training.evaluating import run_closed_loop
    from embodichain.core.training.sharded_ema import ShardedEma

    torch.manual_seed(0)
    model = ChunkPolicy()
    ema = {"Ema": Ema, "ShardedEma": ShardedEma}[kind](model, 0.5)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # an update
    ema.update()
    own = {k: v.clone() for k, v in model.state_dict().items()}
    expected = ChunkPolicy()
    expected.load_state_dict({k: 0.5 * start[k] + 0.5 * own[k] if k != "scale" else own[k]
                              for k in own})
    x = torch.randn(4, 3)
    seen: dict = {}

    class ClosedLoop:
        config = SimpleNamespace(acting="ema")

        def run(self, acting: nn.Module, device: torch.device, *, lockstep: bool,
                **_: object) -> None:
            seen.update(cls=type(acting), chunk=acting.act_chunk(x), lockstep=lockstep,
                        training=acting.training)

    trainer = SimpleNamespace(
        closed_loop=ClosedLoop(), device=CPU, step=1,
        learner=SimpleNamespace(model=model, ema=ema,
                                strategy=SimpleNamespace(collective_forward=True)))
    run_closed_loop(trainer)
    assert issubclass(seen["cls"], ChunkPolicy) and not seen["training"]
    assert torch.allclose(seen["chunk"], expected.act_chunk(x), atol=1e-6)
    assert not torch.allclose(seen["chunk"], model.act_chunk(x))  # not the model's weights
    assert seen["lockstep"] is True
    for key, value in model.state_dict().items():
        assert torch.equal(value, own[key]), key
