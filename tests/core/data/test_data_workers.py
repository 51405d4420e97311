"""Data workers under torchrun (2 gloo ranks): the trained model depends neither on the number
of DataLoader workers nor on the prefetch depth, also across SIGKILLs and resumes with
another worker count (R-DATA-1..3). The dataset augments with torch, `random` and NumPy in
`__getitem__`, and the model has dropout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import REPO, TIMEOUT, assert_ok, run_torchrun
from tests.support.data import data_env, data_recipe
from tests.support.processes import run_python_module
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

MAX_UPDATES = 60
RECIPE = {"trainer.max_updates": MAX_UPDATES, "trainer.save_every": 10}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Trained without data workers (loaded in the training processes), uninterrupted."""
    root = tmp_path_factory.mktemp("data_reference")
    recipe = data_recipe(root / "r.yaml", root / "run", **RECIPE)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=data_env()))
    return root / "run"


def _assert_same_run(run: Path, reference: Path) -> None:
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 6
    assert comparable_records(run) == comparable_records(reference)


# Prefetch 4 here; the other tests of this module run 2 workers at the default prefetch
# (2) and 3 workers at prefetch 3, each compared bitwise with the run without workers.
@pytest.mark.parametrize("prefetch", [4])
def test_two_workers_at_any_prefetch_train_the_model_of_none(prefetch: int, reference: Path,
                                                             tmp_path: Path) -> None:
    """Catches augmentation seeded per worker or per prefetch slot, a DataLoader that draws
    its workers' base seed from the training stream (dropout would shift), and indices
    other than the sampler's: the whole state (model, optimizer, every rank's RNG streams
    and sampler) equals the run without workers, bitwise."""
    recipe = data_recipe(tmp_path / "r.yaml", tmp_path / "run", **RECIPE,
                         **{"trainer.data_workers": 2, "trainer.prefetch": prefetch})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=data_env()))
    _assert_same_run(tmp_path / "run", reference)


def test_sigkill_with_data_workers_under_max_restarts_continues_exactly(
        reference: Path, tmp_path: Path) -> None:
    """Catches a checkpoint that counts the batches the workers had prefetched (the restart
    would skip them): rank 1 is SIGKILLed at update 27 while 2 data workers each hold 2
    batches ahead; torchrun restarts the group and `--resume auto` continues bitwise."""
    run = tmp_path / "run"
    recipe = data_recipe(tmp_path / "r.yaml", run, **RECIPE, **{"trainer.data_workers": 2})
    kills = [{"id": "k0", "rank": 1, "update": 27}]
    env = data_env(EMBODICHAIN_TEST_KILLS=json.dumps(kills),
                   EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "kills.log"))
    proc = run_python_module("torch.distributed.run", "--standalone", "--nnodes=1",
                             "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.2",
                             "-m", "embodichain", "train-sl", "--config", str(recipe),
                             "--resume", "auto", "--no-progress", cwd=REPO, env=env,
                             timeout=TIMEOUT)
    assert_ok(proc)
    assert (tmp_path / "kills.log").read_text().split() == ["k0"]
    events = json.loads((run / "run.json").read_text())["events"]
    assert [e["step"] for e in events if e["event"] == "resumed"] == [20]
    _assert_same_run(run, reference)


def test_a_resume_with_another_worker_count_continues_exactly(reference: Path,
                                                              tmp_path: Path) -> None:
    """Catches state that ties a snapshot to the worker count it was written with (as
    torchdata's StatefulDataLoader does): the snapshot of update 30, written without
    workers, resumed with 3."""
    recipe = data_recipe(tmp_path / "r.yaml", tmp_path / "run", **RECIPE,
                         **{"trainer.data_workers": 3, "trainer.prefetch": 3})
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume",
                           str(reference / "step_30.pt"), "--no-progress", env=data_env()))
    assert assert_training_state_equal(reference / "last.pt", tmp_path / "run" / "last.pt") >= 6
    assert [r for r in comparable_records(tmp_path / "run") if r["step"] > 30] == \
        [r for r in comparable_records(reference) if r["step"] > 30]
