"""`embodichain reproduce RUN_DIR` (R-TRUST-5): a run's stored recipe trained again from
scratch, on its world size, compared with the original record by record and snapshot by
snapshot, the recorded environments beside it.

Cheap runs: the CPU example for 6 updates in one process (shared by the module), the shared
2-worker kill-point reference for its first 4 updates, and a 4-update run over a tiny
LeRobot dataset on disk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.support import assert_ok, factories_env, run_cli, write_recipe

# A cosine schedule: it spans trainer.max_updates, so a shorter recipe changes every update.
SHORT = {"trainer.max_updates": 6, "trainer.save_every": 3, "trainer.validate_every": 3,
         "trainer.log_every": 1, "scheduler.name": "cosine", "scheduler.end_lr": 0.0001}
TABLE = "data/chunk-000/file-000.parquet"


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU example with a cosine schedule, trained for 6 updates in one process
    (read-only)."""
    root = tmp_path_factory.mktemp("reproduce")
    recipe = write_recipe(root / "r.yaml", root / "run", **SHORT)
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    return root / "run"


def _reproduce(*args: str, env: dict[str, str] | None = None):
    return run_cli("reproduce", *args, "--no-progress", env=env)


def test_a_short_run_reproduces_bitwise(short_run: Path, tmp_path: Path) -> None:
    """Catches a reproduction that is not a fresh run of the stored recipe (another seed,
    a resumed state), a comparison that compares nothing (no records, no snapshot) and a
    new directory that is not where it was asked."""
    out = tmp_path / "again"
    proc = _reproduce(str(short_run), "--output", str(out))
    assert_ok(proc)
    assert "bitwise identical through update 6" in proc.stdout
    assert "step_3.pt, step_6.pt" in proc.stdout and " 0 tensors" not in proc.stdout
    again = json.loads((out / "run.json").read_text())
    original = json.loads((short_run / "run.json").read_text())
    assert again["run_id"] != original["run_id"] and again["world_size"] == 1
    assert again["config"]["trainer"]["output_dir"] == str(out)
    assert "the recorded environments are the same" in proc.stdout
    event = again["events"][-1]
    assert (event["event"], event["run_id"], event["through"], event["identical"]) == (
        "reproduced", original["run_id"], 6, True)


def test_until_trains_a_prefix_of_the_same_run(short_run: Path, tmp_path: Path) -> None:
    """Catches --until that shortens the recipe itself (its cosine schedule would then
    reach other learning rates from the first update on), and one that trains or compares
    past N."""
    out = tmp_path / "prefix"
    proc = _reproduce(str(short_run), "--until", "4", "--output", str(out))
    assert_ok(proc)
    assert "bitwise identical through update 4" in proc.stdout
    assert "step_3.pt" in proc.stdout and "step_6.pt" not in proc.stdout
    stored = json.loads((out / "run.json").read_text())["config"]["trainer"]
    assert stored["max_updates"] == SHORT["trainer.max_updates"]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().split()]
    assert max(steps) == 4


def test_a_recorded_torch_version_that_differs_is_named(short_run: Path, copy_run,
                                                       tmp_path: Path) -> None:
    """Catches an environment comparison that ignores the versions or the device the run
    recorded (the same history: only the record of the environment differs, exit 0)."""
    run = copy_run(short_run)
    record = json.loads((run / "run.json").read_text())
    assert record["environment"]["device"] == "cpu"
    record["versions"]["torch"] = "2.0.1"
    record["environment"]["device"] = "cuda: NVIDIA H100 80GB HBM3"
    (run / "run.json").write_text(json.dumps(record))
    proc = _reproduce(str(run), "--output", str(tmp_path / "again"))
    assert_ok(proc)
    assert "bitwise identical through update 6" in proc.stdout
    assert f"torch: 2.0.1 in the original, {torch.__version__} now" in proc.stdout
    assert "device: cuda: NVIDIA H100 80GB HBM3 in the original, cpu now" in proc.stdout


def test_a_changed_metric_is_named_with_its_update(short_run: Path, copy_run,
                                                  tmp_path: Path) -> None:
    """Catches a comparison that skips records or compares with a tolerance: one logged
    loss changed in its last bit is the first difference, named, exit 1."""
    run = copy_run(short_run)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    at = next(i for i, r in enumerate(records) if r["step"] == 5 and "train/loss" in r)
    loss = records[at]["train/loss"]
    records[at]["train/loss"] = float(np.nextafter(loss, np.inf))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _reproduce(str(run), "--output", str(tmp_path / "again"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "differs: first difference at update 5: metric train/loss" in proc.stdout


def test_an_existing_output_directory_is_refused(short_run: Path, tmp_path: Path) -> None:
    """Catches a reproduction written into (or over) a directory that exists, even empty."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    proc = _reproduce(str(short_run), "--output", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"--output {out} exists" in proc.stderr
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_bad_input_is_refused_before_training(short_run: Path, tmp_path: Path) -> None:
    """Catches a missing run or an --until beyond the original found only after training."""
    proc = _reproduce(str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "no such directory" in proc.stderr
    proc = _reproduce(str(short_run), "--until", "7", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2 and "reached update 6 only" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_two_worker_run_reproduces_on_two_workers(short_two_workers: Path,
                                                   tmp_path: Path) -> None:
    """Catches a reproduction on another world size than the run's (its examples per
    update, and so every update, would differ)."""
    out = tmp_path / "again"
    proc = _reproduce(str(short_two_workers), "--until", "4", "--output", str(out))
    assert_ok(proc)
    assert "(2 workers, updates 1-4)" in proc.stdout
    assert "bitwise identical through update 4" in proc.stdout
    assert "step_4.pt" in proc.stdout
    assert json.loads((out / "run.json").read_text())["world_size"] == 2


# -- a dataset on disk -------------------------------------------------------------------------


def _dataset(root: Path) -> Path:
    from embodichain_models.data.lerobot.writer import EpisodeData, feature, write_dataset

    rng = np.random.default_rng(5)
    episodes = [EpisodeData(task="t", values={
        "observation.state": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32)}) for n in (8, 7, 9)]
    return write_dataset(root, episodes, {"observation.state": feature("float32", (3,)),
                                          "action": feature("float32", (2,))}, 10,
                         episodes_per_file=2)


def test_a_changed_dataset_file_is_named(tmp_path: Path) -> None:
    """Catches a report that says the histories differ without the data's identity, or
    names it without the file that changed."""
    data = _dataset(tmp_path / "data")
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **{
        "factory": "file_backed:build_supervised_trainer", "trainer.max_updates": 4,
        "trainer.save_every": 2, "trainer.validate_every": 0, "trainer.log_every": 1,
        "trainer.batch_size": 4})
    text = yaml.safe_load(recipe.read_text())
    del text["model"]  # the file-backed recipe has a data root and no model section
    text["data"] = {"root": str(data)}
    recipe.write_text(yaml.safe_dump(text))
    env = factories_env()
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env))
    table = pq.read_table(data / TABLE)
    action = np.array(table.column("action").to_pylist(), np.float32)
    action[:, 0] += 1.0
    column = pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), 2)
    pq.write_table(table.set_column(table.column_names.index("action"), "action", column),
                   data / TABLE)
    proc = run_cli("reproduce", str(tmp_path / "run"), "--output", str(tmp_path / "again"),
                   "--no-progress", env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "differs: first difference at update 1: metric train/loss" in proc.stdout
    assert "dataset identity: lerobot-v3.0:3 episodes" in proc.stdout
    assert f"changed files: {TABLE})" in proc.stdout


def test_a_run_resumed_for_more_updates_reproduces_from_scratch(resumed_at_100: Path,
                                                                 tmp_path: Path) -> None:
    """Catches a reproduction that trains only the recipe's first trainer.max_updates (100)
    of a run a resume extended to 200, and a report silent about that resume."""
    proc = _reproduce(str(resumed_at_100 / "run"), "--output", str(tmp_path / "again"))
    assert_ok(proc)
    assert "bitwise identical through update 200" in proc.stdout
    assert ("note: the original was resumed at update 100 with trainer.max_updates 200 "
            "(until then 100)") in proc.stdout


def test_until_before_anything_recorded_is_refused(sl_ddp_one_process: Path,
                                                   tmp_path: Path) -> None:
    """Catches a verdict on nothing: the example logs every 10 updates and saves at 100, so
    its first 5 updates leave nothing to compare; refused before training (exit 2)."""
    proc = _reproduce(str(sl_ddp_one_process), "--until", "5", "--output", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no metrics and saved no snapshot up to that update (the first at update 10)" \
        in proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_sharded_run_is_compared_shard_by_shard(tmp_path: Path) -> None:
    """Catches a comparison of a sharded checkpoint's manifest alone (it holds no model
    tensor): each rank's shard is read and its tensors compared."""
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.runs.snapshot_compare import leaves, training_state

    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **{
        **SHORT, "trainer.max_updates": 3, "trainer.strategy": "fsdp"})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--nproc-per-node", "2",
                      "--no-progress"))
    proc = _reproduce(str(tmp_path / "run"), "--output", str(tmp_path / "again"))
    assert_ok(proc)
    assert "bitwise identical through update 3" in proc.stdout and "step_3.pt" in proc.stdout
    manifest = tmp_path / "run" / "step_3.pt"
    state = dict(leaves(training_state(manifest, read_checkpoint(manifest), set())))
    for rank in (0, 1):
        assert any(path.startswith(f"parts.{rank}.") and leaf.kind.startswith("tensor")
                   for path, leaf in state.items()), sorted(state)
