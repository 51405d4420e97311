"""`trainer.strategy: fsdp` trains the same model as ddp (R-SHARD-1), and export consolidates
its sharded checkpoint (R-SHARD-4). Real torchrun, 2 gloo workers, 50 updates per run.

Two pairs of runs, each shared by the tests of this module: the built-in sl_ddp recipe with
plain SGD (no clipping: a gradient's scale shows in the weights, which Adam's normalisation
would hide), and tests/factories/sharded_blocks.py (named shard blocks with uneven dim-0
shards, parameter groups, uneven masks with zero-weight batches) with gradient accumulation,
EMA and gradient clipping; its fsdp run counts FSDP2's reduce-scatters
(tests/scripts/counting_collectives.py). The tolerance, 1e-5 relative, allows for the
summation order: FSDP reduce-scatters the gradient sum per shard and the clipping norm is
summed over shards, where DDP all-reduces buckets and sums the norm over whole tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import read_shard, shard_table
from embodichain.plugins.sl_ddp import make_model
from tests.support import (
    FACTORIES,
    SCRIPTS,
    assert_ok,
    run_cli,
    run_torchrun,
    worker_env,
    write_recipe,
)
from tests.support.state_compare import comparable_records

RUN = {"trainer.max_updates": 50, "trainer.save_every": 25, "trainer.validate_every": 25,
       "trainer.log_every": 10}
# SGD, no clipping: gloo's AVG would halve every step (Adam would not show it).
BUILTIN = {**RUN, "optimizer": {"name": "sgd", "lr": 0.05}}
EVERYTHING = {**RUN, "factory": "sharded_blocks:build_supervised_trainer",
              "trainer.batch_size": 3, "trainer.grad_accumulation": 2,
              "trainer.ema": {"decay": 0.9, "validate": "both"},
              "optimizer": {"name": "adamw", "lr": 0.01, "weight_decay": 0.01,
                            "grad_clip": 0.5, "no_decay": ["bias"]},
              "model": {"hidden": 9}}


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FACTORIES), str(SCRIPTS),
                                       os.environ.get("PYTHONPATH")) if p)
    return worker_env(PYTHONPATH=path)


def train(root: Path, name: str, module: str = "embodichain", **changes: object) -> Path:
    """A 2-worker run of `changes`; under `module="counting_collectives"` its counts are in
    `root / name`.counts/."""
    run = root / name
    recipe = write_recipe(root / f"{name}.yaml", run, **changes)
    extra = {"EMBODICHAIN_TEST_COUNTS_DIR": str(root / f"{name}.counts")}
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env={**env(), **extra}, module=module))
    return run


@pytest.fixture(scope="module")
def builtin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fsdp_builtin")
    return (train(root, "ddp", **BUILTIN),
            train(root, "fsdp", **BUILTIN, **{"trainer.strategy": "fsdp"}))


@pytest.fixture(scope="module")
def everything(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fsdp_everything")
    return (train(root, "ddp", **EVERYTHING),
            train(root, "fsdp", module="counting_collectives",
                  **EVERYTHING, **{"trainer.strategy": "fsdp",
                                                 "trainer.fsdp": {"reshard_after_forward":
                                                                  False}}))


def consolidated(run: Path, key: str = "model") -> dict[str, torch.Tensor]:
    data = read_checkpoint(run / "last.pt")
    shards = [read_shard(run, data, r)["payload"] for r in range(2)]
    return {name: torch.cat([s[key][name] for s in shards]) for name in shards[0][key]}


def assert_close(ddp: dict[str, torch.Tensor], fsdp: dict[str, torch.Tensor]) -> None:
    assert ddp.keys() == fsdp.keys()
    for name, expected in ddp.items():
        scale = expected.abs().max().clamp_min(1e-12)
        assert (fsdp[name] - expected).abs().max() <= 1e-5 * scale, name


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_builtin_recipe_fsdp_equals_ddp(builtin: tuple[Path, Path]) -> None:
    """Catches: an AVG reduce-scatter instead of SUM (gloo's AVG, or FSDP2's default divide
    factor left in place, in core/distributed/sharding.py: every SGD step is halved, a gap
    of several percent after 50 updates), a missing division by the global weight, or a
    model left unsharded (no shard files)."""
    ddp, fsdp = builtin
    saved = read_checkpoint(fsdp / "last.pt")
    assert saved["manifest"]["strategy"] == "fsdp" and sorted(shard_table(saved)) == [0, 1]
    rows = [read_shard(fsdp, saved, r)["payload"]["model"]["0.weight"].shape[0]
            for r in range(2)]
    assert rows == [16, 16]  # hidden 32 over two ranks: each holds half
    assert_close(read_checkpoint(ddp / "last.pt")["payload"]["learner"]["model"],
                 consolidated(fsdp))


@pytest.mark.slow
def test_uneven_masks_groups_accumulation_ema_and_clipping_fsdp_equals_ddp(
        everything: tuple[Path, Path]) -> None:
    """Catches: weights not summed over micro-batches and ranks (uneven masks, zero-weight
    batches), parameter groups lost when
    the parameters become shards (the first layer's lr_scale), EMA not on the shards or not
    swapped in to validate it, or a clipping norm taken over one rank's shard only."""
    ddp, fsdp = everything
    learner = read_checkpoint(ddp / "last.pt")["payload"]["learner"]
    assert_close(learner["model"], consolidated(fsdp))
    assert_close(learner["ema"], consolidated(fsdp, "ema"))
    data = read_checkpoint(fsdp / "last.pt")
    groups = read_shard(fsdp, data, 0)["payload"]["optimizer"]["param_groups"]
    assert [g["name"] for g in groups][:1] == ["first"] and groups[0]["lr_scale"] == 0.1
    # uneven shards of the named blocks: 9 and 12 rows over 2 ranks
    rows = [read_shard(fsdp, data, r)["payload"]["model"]["2.weight"].shape[0]
            for r in range(2)]
    assert rows == [6, 6]
    first = [read_shard(fsdp, data, r)["payload"]["model"]["0.weight"].shape[0]
             for r in range(2)]
    assert first == [5, 4]
    # validation of the model and of the EMA (swapped into the shards) on every rank
    ddp_val, fsdp_val = ([r for r in comparable_records(run) if "validation_ema/mse" in r]
                         for run in everything)
    assert len(ddp_val) == len(fsdp_val) == 2
    for a, b in zip(ddp_val, fsdp_val, strict=True):
        for key in ("validation/mse", "validation_ema/mse"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), key


def test_accumulation_reduce_scatters_once_per_group_and_update(
        everything: tuple[Path, Path]) -> None:
    """With trainer.grad_accumulation: 2 every FSDP2 parameter group (the two named blocks
    and the root) reduce-scatters its gradients once per update, on the last micro-batch.
    Catches: gradient sync left on for every micro-batch (the summed reduce-scatters give
    the same values, so the parity tests cannot see it; the count doubles), or sync never
    turned back on for the last one (no reduce-scatter)."""
    root = everything[1].parent
    for rank in range(2):
        counts = json.loads((root / "fsdp.counts" / f"rank{rank}.json").read_text())
        assert counts["fsdp_groups"] == 3, counts  # shard_blocks [model[0], model[2]], root
        assert counts["reduce_scatters"] == RUN["trainer.max_updates"] * 3, counts


def test_fsdp_metrics_match_ddp(builtin: tuple[Path, Path]) -> None:
    """Catches: validation under fsdp evaluated on rank 0 alone (it would hang in the
    forward's all-gather) or with the wrong weights, and the global loss mis-reduced."""
    ddp, fsdp = (comparable_records(run) for run in builtin)
    assert [sorted(r) for r in ddp] == [sorted(r) for r in fsdp]
    for a, b in zip(ddp, fsdp, strict=True):
        for key, value in a.items():
            assert b[key] == pytest.approx(value, rel=1e-5), key


def test_export_of_a_sharded_checkpoint_loads_into_the_plain_model(
        builtin: tuple[Path, Path], tmp_path: Path) -> None:
    """Catches: an export that needs torchrun, loses the uneven last shard, or writes the
    shards' local tensors instead of the consolidated ones."""
    _, fsdp = builtin
    out = tmp_path / "model.pt"
    proc = run_cli("export", str(fsdp), str(out))
    assert proc.returncode == 0, proc.stderr
    state = torch.load(out, weights_only=True)
    model = make_model(32)
    model.load_state_dict(state)
    trained = consolidated(fsdp)
    for name, value in model.state_dict().items():
        assert torch.equal(value, trained[name]), name


def test_export_of_sharded_ema_weights(everything: tuple[Path, Path], tmp_path: Path) -> None:
    """Catches: --ema exporting the model's own weights from a sharded checkpoint."""
    _, fsdp = everything
    out = tmp_path / "ema.pt"
    proc = run_cli("export", str(fsdp / "last.pt"), str(out), "--ema")
    assert proc.returncode == 0, proc.stderr
    exported = torch.load(out, weights_only=True)
    ema = consolidated(fsdp, "ema")
    assert exported.keys() == ema.keys()
    assert all(torch.equal(exported[k], ema[k]) for k in ema)
    assert not all(torch.equal(exported[k], consolidated(fsdp)[k]) for k in ema)


def test_one_process_fsdp_trains_like_ddp(tmp_path: Path) -> None:
    """Without torchrun, fsdp shards over a one-rank group of its own (the same model as ddp:
    one rank, nothing reduced). Catches: a single process refused or crashing for want of a
    process group, or the group left behind (the run would not exit cleanly)."""
    short = {"trainer.max_updates": 20, "trainer.save_every": 10, "trainer.validate_every": 10}
    runs = {}
    for strategy in ("ddp", "fsdp"):
        recipe = write_recipe(tmp_path / f"{strategy}.yaml", tmp_path / strategy,
                              **short, **{"trainer.strategy": strategy})
        proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
        assert proc.returncode == 0, proc.stderr
        runs[strategy] = tmp_path / strategy
    data = read_checkpoint(runs["fsdp"] / "last.pt")
    assert sorted(shard_table(data)) == [0]
    assert_close(read_checkpoint(runs["ddp"] / "last.pt")["payload"]["learner"]["model"],
                 read_shard(runs["fsdp"], data, 0)["payload"]["model"])


def test_a_validation_failure_on_rank_one_stops_every_rank_naming_it(tmp_path: Path) -> None:
    """Under fsdp every rank runs `evaluate`; rank 1's fails. Every rank exits non-zero
    within 30 s and torchrun's report carries rank 1's message naming its rank and error.
    Catches: the failure swallowed on rank 1 (it then computed no metrics and rank 0 went
    on, or waited in a collective for a rank that gave up), a failing rank that enters
    another collective instead of stopping, and rank 0's lost connection recorded in
    run.json as the run's failure instead of rank 1's message."""
    import time

    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**RUN, "factory": "failing_validation:on_rank_one",
                             "trainer.strategy": "fsdp", "trainer.max_updates": 30,
                             "trainer.validate_every": 10})
    start = time.monotonic()
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress", env=env(),
                        timeout=120)
    assert proc.returncode != 0, proc.stderr
    # The run reached update 10 quickly; from the failure on, 30 s is the budget.
    assert time.monotonic() - start < 90
    assert ("validation failed on rank 1 at update 10: ValueError: the validation corpus of "
            "rank 1 is unreadable") in proc.stderr, proc.stderr[-3000:]
    assert "Root Cause" in proc.stderr and "exitcode  : 1" in proc.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert max(r["step"] for r in records) == 10  # nothing trained after the failure
    # rank 0, waiting for rank 1 in the collective after validation, records rank 1's words
    events = json.loads((tmp_path / "run" / "run.json").read_text())["events"]
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and ("validation failed on rank 1 at update 10: ValueError"
                                 in failed[0]["error"]), events


@pytest.mark.slow  # a 2-worker run to update 10: kept out of the quick loop
def test_a_validation_failure_before_the_forward_is_what_the_run_records(tmp_path: Path
                                                                          ) -> None:
    """Under fsdp rank 1's `evaluate` fails before its forward, so rank 0 is inside the
    forward's all-gather waiting for it (R-STRAT-2). Every rank has ended within 30 s of the
    failure (torchrun's report dates each worker's end), and the failing rank's own message
    (not rank 0's lost connection) is what run.json's `failed` event and `embodichain runs`
    show. Catches a failing rank that
    enters another collective instead of stopping (a hang until the timeout) and rank 0's
    "validation failed on rank 0: ... Connection closed by peer" recorded as the run's
    failure, hiding the cause."""
    import re
    from datetime import datetime

    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run",
                          **{**RUN, "factory": "failing_validation:before_forward_on_rank_one",
                             "trainer.strategy": "fsdp", "trainer.max_updates": 30,
                             "trainer.validate_every": 10})
    failed_at = tmp_path / "failed_at"
    proc = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                        env={**env(), "FAILED_AT_FILE": str(failed_at)}, timeout=120)
    assert proc.returncode != 0, proc.stderr
    # When each worker ended, as torchrun's report has it (the time its error was recorded,
    # whole seconds): not the launcher's own exit, which a loaded machine delays.
    ends = [datetime.strptime(t, "%Y-%m-%d_%H:%M:%S").timestamp()
            for t in re.findall(r"time\s+: (\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d)", proc.stderr)]
    assert len(ends) == 2, proc.stderr[-3000:]
    assert max(ends) - float(failed_at.read_text()) < 30, proc.stderr[-3000:]
    message = ("validation failed on rank 1 at update 10: ValueError: the validation corpus "
               "of rank 1 is unreadable")
    assert message in proc.stderr, proc.stderr[-3000:]
    events = json.loads((tmp_path / "run" / "run.json").read_text())["events"]
    failed = [e for e in events if e["event"] == "failed"]
    assert len(failed) == 1 and message in failed[0]["error"], events
    shown = run_cli("runs", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert message in " ".join(shown.stdout.split()), shown.stdout
