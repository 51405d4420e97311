"""Training on a LeRobot mixture (R-SCALE-3) under torchrun (2 gloo ranks): two datasets of
different fps and key names mixed 3:1 (tests/factories/mixing.py). The weighted draw keeps
§11 (any worker count, exact resume after a SIGKILL with another worker count) and, under
`trainer.global_batch_size`, R-ELASTIC-2 (one rank and two draw the same examples); each
update records its examples per part, summed over the ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.models.lerobot.helpers import mixture_parts
from tests.support import assert_ok, run_cli, run_torchrun
from tests.support.data import data_env, data_recipe
from tests.support.recovery import metrics
from tests.support.state_compare import assert_training_state_equal, comparable_records

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

UPDATES = 24
RECIPE = {"factory": "mixing:build_supervised_trainer", "trainer.batch_size": 16,
          "trainer.max_updates": UPDATES, "trainer.save_every": 8, "trainer.log_every": 1,
          "trainer.validate_every": 0}


@pytest.fixture(scope="module")
def mixture_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixture_parts")
    mixture_parts(root)
    return root


def _train(directory: Path, name: str, mixture_dir: Path, *args: str, ranks: int = 2,
           env: dict[str, str] | None = None, **changes: object):
    run, records = directory / name, directory / f"{name}_records"
    records.mkdir(exist_ok=True)
    recipe = data_recipe(directory / f"{name}.yaml", run, **{**RECIPE, **changes})
    argv = ("train-sl", "--config", str(recipe), "--no-progress", *args)
    environ = data_env(MIXTURE_DIR=str(mixture_dir), RECORD_DIR=str(records), **(env or {}))
    proc = run_torchrun(*argv, env=environ) if ranks == 2 else run_cli(*argv, env=environ)
    return run, proc


def _drawn(run: Path) -> dict[int, list[tuple[int, int, int]]]:
    """Each update's examples (part, mixture episode, frame), rank by rank, in order."""
    lines = [json.loads(line) for path in sorted(run.parent.glob(f"{run.name}_records/*"))
             for line in path.read_text().splitlines()]
    updates: dict[int, list[tuple[int, int, int]]] = {}
    for r in sorted(lines, key=lambda r: (r["step"], r["rank"])):
        updates.setdefault(r["step"], []).extend(zip(r["part"], r["episode"], r["frame"],
                                                     strict=True))
    return updates


@pytest.fixture(scope="module")
def reference(mixture_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ranks, no data workers, uninterrupted."""
    run, proc = _train(tmp_path_factory.mktemp("mix_reference"), "run", mixture_dir)
    assert_ok(proc)
    return run


def test_each_part_is_drawn_by_weight_and_counted_over_both_ranks(reference: Path) -> None:
    """Catches a uniform draw over the concatenated examples (A is 63/89 = 0.71 of them),
    and per-part counts taken from one rank only or never summed: `train/examples/<part>`
    of every update add up to both ranks' 2 x 16 examples, equal what the objectives saw,
    and A's share over the run lies within 5 binomial sigma of 3/4."""
    records = [r for r in metrics(reference) if "train/examples/a" in r]
    assert [r["step"] for r in records] == list(range(1, UPDATES + 1))
    drawn = _drawn(reference)
    for r in records:
        parts = [p for p, _, _ in drawn[r["step"]]]
        assert (r["train/examples/a"], r["train/examples/b"]) == (parts.count(0),
                                                                  parts.count(1))
        assert r["train/examples/a"] + r["train/examples/b"] == 32
    n = 32 * UPDATES
    share = sum(r["train/examples/a"] for r in records) / n
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / n), share


def test_two_data_workers_train_the_model_of_none_bitwise(reference: Path, mixture_dir: Path,
                                                         tmp_path: Path) -> None:
    """Catches a weighted draw made in the loader's workers or seeded per worker: with 2
    data workers every update draws the same examples and the whole training state
    (model, optimizer, RNG streams, samplers) is bitwise the run without workers."""
    run, proc = _train(tmp_path, "run", mixture_dir, **{"trainer.data_workers": 2})
    assert_ok(proc)
    assert _drawn(run) == _drawn(reference)
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 4
    assert comparable_records(run) == comparable_records(reference)


def test_sigkill_then_resume_with_another_worker_count_continues_exactly(
        reference: Path, mixture_dir: Path, tmp_path: Path) -> None:
    """Catches weighted-sampler state that a snapshot does not hold or ties to the worker
    count (a generator stream advanced by the workers' look-ahead): trained with 2 data
    workers, rank 1 SIGKILLed in update 13, resumed from the update-8 snapshot without
    workers, the run ends bitwise where the reference does."""
    kills = {"EMBODICHAIN_TEST_KILLS": json.dumps([{"id": "k", "rank": 1, "update": 13}]),
             "EMBODICHAIN_TEST_KILL_LOG": str(tmp_path / "kills.log")}
    run, proc = _train(tmp_path, "run", mixture_dir, env=kills,
                       **{"trainer.data_workers": 2})
    assert proc.returncode != 0 and (tmp_path / "kills.log").read_text().split() == ["k"]
    run, proc = _train(tmp_path, "run", mixture_dir, "--resume", "auto")
    assert_ok(proc)
    assert assert_training_state_equal(reference / "last.pt", run / "last.pt") >= 4
    assert [r for r in comparable_records(run) if r["step"] > 8] == \
        [r for r in comparable_records(reference) if r["step"] > 8]


def test_under_a_global_batch_one_rank_and_two_draw_the_same_examples(
        mixture_dir: Path, tmp_path: Path) -> None:
    """Catches a weighted draw seeded by the rank or the world size under G: G = 16 as one
    rank x 2 micro-batches of 8 or two ranks x 1 trains every update on the same examples
    of the same parts, in global order, and records the same per-part counts."""
    g = {"trainer.batch_size": 8, "trainer.global_batch_size": 16, "trainer.max_updates": 8}
    one, proc = _train(tmp_path, "one", mixture_dir, ranks=1, **g)
    assert_ok(proc)
    two, proc = _train(tmp_path, "two", mixture_dir, **g)
    assert_ok(proc)
    assert sorted(_drawn(one)) == list(range(1, 9))
    assert _drawn(two) == _drawn(one)
    counts = [[r.get("train/examples/a"), r.get("train/examples/b")] for r in metrics(one)
              if "train/examples/a" in r]
    assert len(counts) == 8 and counts == [[r.get("train/examples/a"),
                                            r.get("train/examples/b")]
                                           for r in metrics(two) if "train/examples/a" in r]
