"""Continuing a run on another world size under `trainer.global_batch_size` (R-ELASTIC-3).

A run of G = 32 (micro-batches of 8: four per update on one rank, two on each of two)
trains to update 50 on one world size and continues to update 100 on another, with 2 data
workers and an EMA, under DDP and under FSDP (whose shards are then re-cut on load),
against the run that was never interrupted. The factory
(tests/factories/global_recording.py) has no dropout, so nothing per-rank is random and the
two runs differ only in the order in which each update's gradients are summed.

The bound: every tensor of the model, the EMA and Adam's state (a sharded checkpoint's put
together from its shards) within a relative 1e-5
(‖a − b‖ / ‖a‖) of the uninterrupted run's. Each update sums the same 16 per-example
gradients in another grouping (one rank's autograd accumulation over K micro-batches against
gloo's all-reduce over ranks): a few float32 roundings (~6e-8 relative) per update, which
Adam, whose step divides by √v, carries forward without growing them by more than a small
factor over 50 updates. Measured: at most 1.2e-7 (2 → 1) and 7.4e-8 (1 → 2); 1e-5 leaves two
orders of margin, while a wrong example, augmentation or weight moves tensors by far more
(a 1e-2 to 1e-1 difference).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.export import checkpoint_model
from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.sharded import is_sharded_checkpoint, read_shard
from tests.support import assert_ok, run_cli, run_torchrun
from tests.support.data import data_env, data_recipe

ELASTIC = {"factory": "global_recording:build_supervised_trainer", "trainer.batch_size": 8,
           "trainer.global_batch_size": 32, "trainer.max_updates": 100,
           "trainer.save_every": 50, "trainer.validate_every": 50, "trainer.log_every": 10,
           "trainer.data_workers": 2, "trainer.ema": {"decay": 0.9},
           "data.train_size": 200, "data.val_size": 16}
BOUND = 1e-5
FSDP = {"trainer.strategy": "fsdp"}
FRESH = "EMBODICHAIN_TESTS_FRESH"


def _launch(ranks: int, *args: str, records: Path) -> None:
    env = data_env(RECORD_DIR=str(records))
    assert_ok(run_torchrun(*args, "--no-progress", env=env) if ranks == 2
              else run_cli(*args, "--no-progress", env=env))


def _records(directory: Path) -> dict[int, list[int]]:
    """Each update's example indices in global order (rank by rank, call order)."""
    lines = [json.loads(line) for path in sorted(directory.glob("rank*.jsonl"))
             for line in path.read_text().splitlines()]
    updates: dict[int, list[int]] = {}
    for r in sorted(lines, key=lambda r: (r["step"], r["rank"])):
        updates.setdefault(r["step"], []).extend(r["index"])
    return updates


def _optimizer_state(path: Path, data: dict) -> dict[tuple[int, str], torch.Tensor]:
    """Every Adam state tensor of a checkpoint by (parameter index, key): an unsharded one's
    as saved; a sharded one's put together from every rank's shard, each rank's dim-0 rows
    at the offset its manifest records (so checkpoints of different world sizes compare)."""
    if not is_sharded_checkpoint(data):
        return {(index, key): value
                for index, state in data["payload"]["learner"]["optimizer"]["state"].items()
                for key, value in state.items() if isinstance(value, torch.Tensor)}
    shards = [read_shard(path.parent, data, r)["payload"]["optimizer"]
              for r in range(int(data["manifest"]["world_size"]))]
    full = {}
    for index, state in shards[0]["state"].items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key not in shards[0]["sharded_keys"].get(index, ()):
                full[(index, key)] = value  # replicated (Adam's step)
                continue
            cuts = [(s["offsets"][index][key], s["state"][index][key]) for s in shards]
            rows = cuts[0][0][2]
            pieces = sorted(((offset, part) for (offset, length, _), part in cuts if length),
                            key=lambda piece: piece[0])
            assert [offset for offset, _ in pieces] == list(
                itertools.accumulate([0] + [len(p) for _, p in pieces[:-1]])), (index, key)
            full[(index, key)] = torch.cat([part for _, part in pieces])
            assert len(full[(index, key)]) == rows, (index, key)
    return full


def _relative_differences(a: Path, b: Path) -> dict[str, float]:
    """‖a − b‖ / ‖a‖ of every model and EMA tensor of two checkpoints, and of every Adam
    state tensor (sharded checkpoints consolidated, the optimizer's state too)."""
    data_a, data_b = read_checkpoint(a), read_checkpoint(b)
    pairs = {}
    for ema in (False, True):
        full_a, full_b = checkpoint_model(a, data_a, ema=ema), checkpoint_model(b, data_b, ema=ema)
        pairs.update({f"{'ema' if ema else 'model'}.{k}": (v, full_b[k])
                      for k, v in full_a.items() if v.is_floating_point()})
    state_a, state_b = _optimizer_state(a, data_a), _optimizer_state(b, data_b)
    assert sorted(state_a) == sorted(state_b) and len(state_a) >= 8, (state_a, state_b)
    for (index, key), value in state_a.items():
        if value.numel() > 1:
            pairs[f"optimizer.{index}.{key}"] = (value, state_b[(index, key)])
        else:  # Adam's step count: the same number of steps taken
            assert torch.equal(value, state_b[(index, key)]), (index, key)
    return {name: float((x - y).norm() / x.norm().clamp_min(1e-30))
            for name, (x, y) in pairs.items()}


def _report(differences: dict[str, float]) -> None:
    """The figure behind the bound, shown with `pytest -s` (docs/recovery.md quotes it)."""
    worst = max(differences, key=differences.__getitem__)
    print(f"\nlargest relative difference: {differences[worst]:.2e} ({worst}, "
          f"{len(differences)} tensors)")


class _Uninterrupted(dict):
    """The runs never interrupted, each trained when a test first asks for it (so that CI's
    fresh-worker pass, which picks a few of these tests, trains only the runs they use):
    {world size: run directory} with replacement, {"epochs": ...} of two ranks in epochs
    (200 examples: 6 updates of 32 an epoch), and {"fsdp<world size>": ...} sharded."""

    KINDS = {2: (2, {}), 1: (1, {}), "epochs": (2, {"trainer.sampling": "epochs"}),
             "fsdp2": (2, FSDP), "fsdp1": (1, FSDP)}

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base
        # As the session had it: a reference is a fixture's run, built warm even when the
        # test that first asks for it starts its own launches fresh (conftest's
        # `_fresh_workers`, CI's EMBODICHAIN_TESTS_FRESH=marked; docs/development.md).
        self.fresh = os.environ.get(FRESH)

    def __missing__(self, key: object) -> Path:
        ranks, changes = self.KINDS[key]
        run, records = self.base / f"ref{key}", self.base / f"ref{key}_records"
        records.mkdir()
        recipe = data_recipe(self.base / f"ref{key}.yaml", run, **{**ELASTIC, **changes})
        with pytest.MonkeyPatch.context() as env:
            if self.fresh is None:
                env.delenv(FRESH, raising=False)
            else:
                env.setenv(FRESH, self.fresh)
            _launch(ranks, "train-sl", "--config", str(recipe), records=records)
        self[key] = run
        return run


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[object, Path]:
    """The runs never interrupted (`_Uninterrupted`), shared by the tests of this module."""
    return _Uninterrupted(tmp_path_factory.mktemp("elastic"))


def _stopped_at_50(ref: Path, run: Path, records: Path) -> None:
    """`run` (and its example records): the uninterrupted run `ref` as it was when its
    update-50 snapshot was its newest, i.e. a run of `ref`'s world size stopped after
    update 50 (the snapshot of update 100 removed; its records beyond 50 stay in
    metrics.jsonl, for the resume to roll back). Every rank's own state, shard and the
    stored recipe are what those ranks wrote; a run trained to update 50 only would hold
    the same tensors (no schedule depends on max_updates)."""
    shutil.copytree(ref, run)
    for name in ("step_100.pt", "last.pt"):
        (run / name).unlink()
    (run / ".lock").unlink(missing_ok=True)
    records.mkdir()
    for path in sorted((ref.parent / f"{ref.name}_records").glob("rank*.jsonl")):
        kept = [line for line in path.read_text().splitlines()
                if json.loads(line)["step"] <= 50]
        (records / path.name).write_text("".join(f"{line}\n" for line in kept))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["with_replacement", "epochs", "fsdp"])
def test_two_ranks_continue_on_one_in_place(tmp_path: Path, uninterrupted: dict[object, Path],
                                            variant: str) -> None:
    """Catches a world-size change that is refused under G, a stored recipe whose derived
    grad_accumulation (2 on two ranks) pins the continuation (one rank needs 4), a sampler
    position or augmentation that depends on the world size (other examples after update
    50), and per-rank state taken from a rank that no longer exists: two ranks trained to
    update 50 (the uninterrupted two-rank run as it was then: `_stopped_at_50`), `resume
    RUN_DIR` on one rank continues in place to 100, and every update draws the examples of
    the uninterrupted run, whose state it ends within the bound of the module docstring,
    EMA included; in epochs the continuation starts in the middle of the ninth epoch; under
    FSDP the two shards are re-cut into one; run.json records the change."""
    run, records = tmp_path / "run", tmp_path / "records"
    ref = uninterrupted[{"with_replacement": 2, "epochs": "epochs", "fsdp": "fsdp2"}[variant]]
    _stopped_at_50(ref, run, records)
    _launch(1, "resume", str(run), "--set", "trainer.max_updates=100", records=records)
    assert _records(records) == _records(ref.parent / f"{ref.name}_records")
    differences = _relative_differences(ref / "last.pt", run / "last.pt")
    assert max(differences.values()) <= BOUND, differences
    _report(differences)
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["world_size_changes"] == [{"from": 2, "to": 1, "at_update": 50}]
    assert run_json["world_size"] == 1
    resumed = [e for e in run_json["events"] if e["event"] == "resumed"]
    assert resumed[-1]["world_size_from"] == 2 and resumed[-1]["world_size"] == 1
    manifest = read_checkpoint(run / "last.pt")["manifest"]
    assert manifest["world_size"] == 1 and manifest["step"] == 100


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_one_rank_continues_on_two_from_a_checkpoint(tmp_path: Path,
                                                     uninterrupted: dict[object, Path],
                                                     strategy: str) -> None:
    """Catches per-rank state scattered by old rank (a new rank 1 with no saved state), and
    a second rank that starts its draw from update 0: a one-rank checkpoint at update 50
    continues on two ranks into a new directory, drawing the uninterrupted run's examples
    and ending within the bound; under FSDP the one shard is re-cut into two."""
    ref = uninterrupted[1 if strategy == "ddp" else "fsdp1"]
    run, records = tmp_path / "continued", tmp_path / "records"
    records.mkdir()
    recipe = data_recipe(tmp_path / "continued.yaml", run,
                         **{**ELASTIC, **(FSDP if strategy == "fsdp" else {})})
    _launch(2, "train-sl", "--config", str(recipe), "--resume", str(ref / "step_50.pt"),
            records=records)
    expected = {u: x for u, x in _records(ref.parent / f"{ref.name}_records").items() if u > 50}
    assert _records(records) == expected
    differences = _relative_differences(ref / "last.pt", run / "last.pt")
    assert max(differences.values()) <= BOUND, differences
    _report(differences)
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["world_size_changes"] == [{"from": 1, "to": 2, "at_update": 50}]


def _restored_stream(saved_world_size: int, step: int) -> torch.Tensor:
    """What this process's torch stream draws after restoring a one-process run's state
    from a checkpoint of `saved_world_size` ranks at update `step` (seed 7)."""
    from types import SimpleNamespace

    from embodichain.core.checkpoint.rank_state import capture_buffers, capture_rng
    from embodichain.core.training.checkpointing import restore_rank_and_run

    model = torch.nn.BatchNorm1d(2)
    torch.manual_seed(123)
    own = {"rng": capture_rng(torch.device("cpu")), "sampler": {}, "buffers":
           capture_buffers(model)}
    trainer = SimpleNamespace(sampler=SimpleNamespace(load_state_dict=lambda state: None),
                              learner=SimpleNamespace(model=model), callbacks=[],
                              tracker=SimpleNamespace(load_state_dict=lambda state: None))
    torch.manual_seed(999)  # the process's streams before the restore
    payload = {"run": {"step": step, "world_size": saved_world_size, "config": {"seed": 7}}}
    restore_rank_and_run(trainer, own, payload, torch.device("cpu"))
    return torch.rand(4)


def test_own_streams_are_restored_on_the_same_world_size_and_derived_on_another() -> None:
    """Catches saved streams restored on another world size (they were another world's
    ranks': two new ranks would share old rank 0's dropout), and derived streams where the
    saved ones should be restored (a same-size resume would no longer be bitwise): the
    same size gives the saved stream; another gives (seed, update, rank)'s, which differs
    by update."""
    from embodichain.core.checkpoint.rank_state import continued_stream_seed

    torch.manual_seed(123)
    saved = torch.rand(4)
    assert torch.equal(_restored_stream(1, 50), saved)
    torch.manual_seed(continued_stream_seed(7, 50, 0))
    derived = torch.rand(4)
    assert torch.equal(_restored_stream(2, 50), derived)
    assert not torch.equal(derived, saved)
    assert not torch.equal(_restored_stream(2, 60), derived)
    assert continued_stream_seed(7, 50, 0) != continued_stream_seed(7, 50, 1)


def test_inspect_says_which_world_sizes_can_continue_a_checkpoint(
        tmp_path: Path, uninterrupted: dict[object, Path]) -> None:
    """Catches an inspect-checkpoint --config that still demands the checkpoint's world size
    under G, or lists a world size G cannot be divided by: G = 32 with micro-batches of 8
    runs on 1, 2 or 4 workers, and those are listed (exit 0: compatible)."""
    recipe = data_recipe(tmp_path / "same.yaml", tmp_path / "unused", **ELASTIC)
    proc = run_cli("inspect-checkpoint", str(uninterrupted[2] / "step_50.pt"), "--json",
                   "--config", str(recipe), env=data_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    check = json.loads(proc.stdout)["resume"]
    assert check["world_sizes"] == [1, 2, 4]
    assert "any of 1, 2, 4 workers" in check["conditions"][0]


@pytest.mark.slow
def test_resume_auto_continues_a_one_rank_run_on_two_self_launched(
        tmp_path: Path, uninterrupted: dict[object, Path]) -> None:
    """Catches `--resume auto` refusing a run directory of another world size under G (it
    compares the user's recipe, whose grad_accumulation is derived anew, with the stored
    one), and a self-launch that checks G against the old world size: one rank trained to
    update 50 (the uninterrupted one-rank run as it was then: `_stopped_at_50`), then
    `train-sl --resume auto --nproc-per-node 2` continues it in place to 100, within the
    bound."""
    run, records = tmp_path / "run", tmp_path / "records"
    ref = uninterrupted[1]
    _stopped_at_50(ref, run, records)
    recipe = data_recipe(tmp_path / "run.yaml", run, **ELASTIC)
    _launch(1, "train-sl", "--config", str(recipe), "--resume", "auto",
            "--nproc-per-node", "2", records=records)
    assert _records(records) == _records(ref.parent / f"{ref.name}_records")
    differences = _relative_differences(ref / "last.pt", run / "last.pt")
    assert max(differences.values()) <= BOUND, differences
    _report(differences)
    assert json.loads((run / "run.json").read_text())["world_size_changes"] == [
        {"from": 1, "to": 2, "at_update": 50}]
