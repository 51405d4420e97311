"""`embodichain runs`: running from the run's lock, killed = stopped, complete = finished."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from conftest import assert_ok, run_cli, start_endless_run, worker_env, write_recipe

from embodichain.core.runs.run_dir import read_metrics
from embodichain.core.runs.run_lock import lock_holder


def runs_json(root: Path) -> dict[str, dict]:
    proc = run_cli("runs", str(root), "--json")
    assert_ok(proc)
    return {Path(row["directory"]).name: row for row in json.loads(proc.stdout)}


def test_running_stopped_and_finished(tmp_path: Path, sl_ddp_one_process: Path,
                                      sl_ddp_two_workers: Path) -> None:
    root = tmp_path / "outputs"
    shutil.copytree(sl_ddp_one_process, root / "done")
    shutil.copytree(sl_ddp_two_workers, root / "nested" / "done2")
    live = root / "live"
    proc = start_endless_run(tmp_path, live)
    try:
        deadline = time.monotonic() + 120
        while not ((live / "step_500.pt").exists() and lock_holder(live)):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the live run never saved step_500.pt"
            time.sleep(0.2)
        rows = runs_json(root)
        assert rows["live"]["state"] == "running"
        assert rows["live"]["holder"]["pid"] == proc.pid
        table = run_cli("runs", str(root), env=worker_env(COLUMNS="200"))
        assert_ok(table)
        assert f"running (held by pid {proc.pid}" in table.stdout
    finally:
        proc.kill()
        proc.wait(timeout=60)

    rows = runs_json(root)
    assert set(rows) == {"live", "done", "done2"}
    stopped = rows["live"]
    last = read_metrics(live / "metrics.jsonl").last_step
    assert stopped["state"] == "stopped" and stopped["holder"] is None
    assert stopped["snapshot_step"] >= 500 and stopped["last_step"] >= stopped["snapshot_step"]
    assert stopped["last_step"] >= last
    assert stopped["state_text"] == f"stopped at update {stopped['last_step']}"
    for name, run, world in (("done", sl_ddp_one_process, 1), ("done2", sl_ddp_two_workers, 2)):
        row = rows[name]
        identity = json.loads((run / "run.json").read_text())
        mse = [r["validation/mse"] for r in read_metrics(run / "metrics.jsonl").records
               if "validation/mse" in r]
        assert (row["state"], row["snapshot_step"], row["world_size"]) == ("finished", 200, world)
        assert row["run_id"] == identity["run_id"] and row["factory"] == "sl_ddp"
        assert (row["metric"], row["metric_mode"]) == ("validation/mse", "min")
        assert row["metric_last"] == mse[-1] and row["metric_best"] == min(mse)


def test_a_run_cut_short_is_stopped_at_its_last_update(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "short"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 30})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    row = runs_json(tmp_path / "outputs")["short"]
    assert (row["state"], row["snapshot_step"]) == ("finished", 30)  # only last.pt: read torch-free
    data = json.loads((run / "run.json").read_text())
    data["config"]["trainer"]["max_updates"] = 60  # as if asked to train on to 60
    (run / "run.json").write_text(json.dumps(data))
    row = runs_json(tmp_path / "outputs")["short"]
    assert row["state_text"] == "stopped at update 30"


def test_not_a_directory(tmp_path: Path) -> None:
    proc = run_cli("runs", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
