"""`validate-config` finds every problem `train-sl` refuses, and both say the same about a
key that cannot take effect: each case goes through both commands (issue: early_stop with
validate_every 0 refused by train-sl only; save_best with validate_every 0 and data_workers
with an in-memory source silently ignored).

Cases that only the built trainer can tell (its parameter groups, its source, its
evaluate) agree with `validate-config --build`; every other case also with plain
`validate-config`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import FACTORIES, write_recipe
from tests.support.cli import invoke

SMALL = {"trainer.max_updates": 2, "trainer.validate_every": 1, "trainer.save_every": 0,
         "trainer.log_every": 1}
CLASSIFYING = {"factory": "classifying:build_supervised_trainer"}

# (name, recipe changes, exit code of both, text both print, needs --build)
CASES = [
    ("valid", {}, 0, None, False),
    ("early stop without validations", {"trainer.early_stop": {"patience": 2},
                                        "trainer.validate_every": 0}, 2,
     "trainer.early_stop: needs validations", False),
    ("best.pt without validations", {"trainer.save_best": True, "trainer.validate_every": 0},
     2, "trainer.save_best: best.pt is written at a validation", False),
    ("data workers no machine serves", {"trainer.data_workers": 100000}, 2,
     "trainer.data_workers: expected at most 1024", False),
    ("an update too large", {"trainer.batch_size": 2**20, "trainer.grad_accumulation": 2**12},
     2, "trainer.grad_accumulation: expected batch_size x grad_accumulation at most", False),
    ("an EMA that never moves", {"trainer.ema": {"decay": 0.999999999}}, 2,
     "trainer.ema.decay: expected at most", False),
    ("prefetch without workers", {"trainer.prefetch": 8}, 0,
     "warning: trainer.prefetch: 8 has no effect", False),
    ("keep_last without step files", {"trainer.keep_last": 2}, 0,
     "warning: trainer.keep_last: 2 has no effect", False),
    ("data workers for an in-memory source", {"trainer.data_workers": 1}, 0,
     "trainer.data_workers: 1 has no effect: the factory's source is TensorSource", True),
    ("a bad parameter group", {"factory": "scaled:build_supervised_trainer",
                               "groups.first_lr_scale": 0.0}, 2,
     "param_groups[0] ('first'): lr_scale must be", True),
    ("epochs larger than the corpus", {"trainer.sampling": "epochs", "data.train_size": 16},
     2, "trainer.sampling: epochs needs at least", True),
    ("best.pt without an evaluate", {**CLASSIFYING, "data.val_size": 0,
                                     "trainer.save_best": True}, 2,
     "trainer.save_best need validation", True),
    # What a strategy cannot run (R-STRAT-1): refused when the recipe is validated, not
    # only when the trainer is built (validate-config said "valid" to both before).
    ("fsdp with compile", {"trainer.strategy": "fsdp", "trainer.compile": True}, 2,
     "trainer.compile: true is not available with trainer.strategy: fsdp", False),
    ("fsdp with fp16 on cuda", {"trainer.strategy": "fsdp", "trainer.precision": "fp16",
                                "device": "cuda"}, 2,
     "trainer.precision: fp16 is not available with trainer.strategy: fsdp", False),
    ("fsdp with bf16", {"trainer.strategy": "fsdp", "trainer.precision": "bf16"}, 0, None,
     False),
    # R-ELASTIC-1: what no world size divides is refused without knowing the world size.
    ("a global batch no world size divides", {"trainer.global_batch_size": 48}, 2,
     "trainer.global_batch_size: 48 is not a whole multiple of trainer.batch_size 32", False),
    ("a global batch valid for one rank", {"trainer.global_batch_size": 64}, 0, None, False),
    ("a global batch too large to draw", {"trainer.global_batch_size": 2**31}, 2,
     "trainer.global_batch_size: expected at most 2147483647", False),
]


@pytest.mark.parametrize("name, changes, code, text, needs_build", CASES,
                         ids=[c[0] for c in CASES])
def test_validate_config_and_train_sl_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            name: str, changes: dict, code: int,
                                            text: str | None, needs_build: bool) -> None:
    monkeypatch.syspath_prepend(str(FACTORIES))
    run = tmp_path / "run"
    if changes.get("factory") == CLASSIFYING["factory"]:
        import yaml
        base = tmp_path / "base.yaml"
        base.write_text(yaml.safe_dump({
            "factory": CLASSIFYING["factory"], "seed": 0, "device": "cpu",
            "trainer": {"batch_size": 16, "max_updates": 2, "output_dir": str(run)},
            "optimizer": {"name": "adam", "lr": 0.01}, "data": {"train_size": 64}}))
        recipe = write_recipe(tmp_path / "r.yaml", run, base=base, **{**SMALL, **changes})
    else:
        recipe = write_recipe(tmp_path / "r.yaml", run, **{**SMALL, **changes})
    trained = invoke("train-sl", "--config", str(recipe), "--no-progress")
    built = invoke("validate-config", str(recipe), "--build")
    plain = invoke("validate-config", str(recipe))
    assert trained.exit_code == code, trained.output
    assert built.exit_code == code, built.output
    if text is not None:
        assert text in trained.stderr, trained.stderr
        assert text in built.stderr, built.stderr
    if needs_build:
        assert plain.exit_code == 0 and "--build checks it too" in plain.stderr
    else:
        assert plain.exit_code == code, plain.output
        if text is not None:
            assert text in plain.stderr, plain.stderr
    assert run.exists() == (code == 0)


@pytest.mark.parametrize("fact, value, text", [
    ("_process_limit", 5, "trainer.data_workers: 8 worker processes exceed the 5 processes"),
    ("_memory", 4 * 16 * 2**20, "trainer.data_workers: 8 worker processes need at least"),
], ids=["process limit", "memory"])
def test_both_refuse_what_this_machine_cannot_serve(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    fact: str, value: int, text: str) -> None:
    """Catches `validate-config` without the machine check (`refuse_or_warn` not called):
    8 data workers pass the schema's fixed ceiling but not this machine, whose process limit
    (5) or available memory (4 workers' worth), as the check reads them, is set here. Both
    commands refuse with exit 2 and the same message, and nothing is created (the source is
    in memory, so even a broken check would fork no worker)."""
    from embodichain.core.recipe import machine_limits

    monkeypatch.setattr(machine_limits, fact, lambda: value)
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{**SMALL, "trainer.data_workers": 8})
    trained = invoke("train-sl", "--config", str(recipe), "--no-progress")
    plain = invoke("validate-config", str(recipe))
    built = invoke("validate-config", str(recipe), "--build")

    def errors(stderr: str) -> list[str]:
        return [line for line in stderr.splitlines() if line.startswith("error:")]

    for result in (trained, plain, built):
        assert result.exit_code == 2, result.output
        assert text in result.stderr and "Nothing was started" in result.stderr
        assert errors(result.stderr) == errors(trained.stderr)
    assert not run.exists()


@pytest.mark.parametrize("changes, text", [
    ({"trainer.global_batch_size": 96},
     "trainer.global_batch_size: 96 is not a whole multiple of world size x batch_size = "
     "2 x 32 = 64"),
    ({"trainer.global_batch_size": 128, "trainer.grad_accumulation": 1},
     "trainer.grad_accumulation: 1 disagrees with trainer.global_batch_size 128 / (world "
     "size 2 x batch_size 32) = 2"),
], ids=["not divisible", "grad_accumulation disagrees"])
def test_both_refuse_a_global_batch_the_world_size_cannot_divide(
        tmp_path: Path, changes: dict, text: str) -> None:
    """Catches a world-size check of trainer.global_batch_size that only the workers make
    (after the launch), or that `validate-config --nproc-per-node` skips (R-ELASTIC-1): for
    2 ranks, G = 96 with batch 32 (K = 1.5), and grad_accumulation 1 given where K is 2,
    are refused by both commands with the same message naming G, the world size and the
    batch size, exit 2, and no worker starts (no run directory)."""
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{**SMALL, **changes})
    trained = invoke("train-sl", "--config", str(recipe), "--nproc-per-node", "2",
                     "--no-progress")
    plain = invoke("validate-config", str(recipe), "--nproc-per-node", "2")
    for result in (trained, plain):
        assert result.exit_code == 2, result.output
        assert text in result.stderr and "Nothing was started" in result.stderr
    assert not run.exists()
    # On one rank the same recipes divide (K = 3, K = 4 with grad_accumulation derived),
    # so validate-config without a world size does not refuse them.
    if "grad_accumulation" not in changes:
        assert invoke("validate-config", str(recipe)).exit_code == 0
