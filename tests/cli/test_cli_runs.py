"""`embodichain runs`: running from the run's lock, complete = finished, a clean stop (run.json's
`stopped` event) = stopped, killed = interrupted, and unknown for a run.json from before clean
stops were recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics
from tests.support import assert_ok, factories_env, run_cli, write_recipe
from tests.support.cli import cli_in_process


def runs_json(root: Path) -> dict[str, dict]:
    proc = cli_in_process("runs", str(root), "--json")
    assert_ok(proc)
    return {Path(row["directory"]).name: row for row in json.loads(proc.stdout)}


def test_running_stopped_and_finished(tmp_path: Path, sl_ddp_one_process: Path,
                                      sl_ddp_two_workers: Path,
                                      endless_run_stopped: dict) -> None:
    """Catches a live run not shown as running with its holder, a stopped one shown with
    another update than its last record (the signalled run saved a snapshot of exactly
    that update) or without its clean stop recorded in run.json, and a finished run shown
    as anything but finished at its last update."""
    live = endless_run_stopped  # seen by `runs` while live, then SIGTERMed (conftest)
    (row,) = live["live_json"]
    assert Path(row["directory"]).name == "live" and row["state"] == "running"
    assert row["holder"]["pid"] == live["pid"]
    assert f"running (held by pid {live['pid']}" in live["live_table"]
    assert live["returncode"] == 143, live["stderr"]

    root = tmp_path / "outputs"
    shutil.copytree(sl_ddp_one_process, root / "done")
    shutil.copytree(sl_ddp_two_workers, root / "nested" / "done2")
    shutil.copytree(live["run"], root / "live")
    rows = runs_json(root)
    assert set(rows) == {"live", "done", "done2"}
    stopped = rows["live"]
    # SIGTERM stops at an update with a snapshot of it; the last record may be older
    snapshot = read_checkpoint(live["run"] / "last.pt")["manifest"]["step"]
    assert f"stopped at update {snapshot}/" in live["stdout"].splitlines()[0]
    assert 500 <= read_metrics(live["run"] / "metrics.jsonl").last_step <= snapshot
    assert stopped["state"] == "stopped" and stopped["holder"] is None
    assert (stopped["snapshot_step"], stopped["last_step"]) == (snapshot, snapshot)
    assert stopped["state_text"] == f"stopped cleanly at update {snapshot} (SIGTERM)"
    events = json.loads((live["run"] / "run.json").read_text())["events"]
    assert [(e["event"], e["step"]) for e in events] == [("stopped", snapshot)]
    for name, run, world in (("done", sl_ddp_one_process, 1), ("done2", sl_ddp_two_workers, 2)):
        row = rows[name]
        identity = json.loads((run / "run.json").read_text())
        mse = [r["validation/mse"] for r in read_metrics(run / "metrics.jsonl").records
               if "validation/mse" in r]
        assert (row["state"], row["snapshot_step"], row["world_size"]) == ("finished", 200, world)
        assert row["run_id"] == identity["run_id"] and row["factory"] == "sl_ddp"
        assert (row["metric"], row["metric_mode"]) == ("validation/mse", "min")
        assert row["metric_last"] == mse[-1] and row["metric_best"] == min(mse)


def test_a_run_cut_short_is_not_finished(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "short"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 30})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress"))
    row = runs_json(tmp_path / "outputs")["short"]
    assert (row["state"], row["snapshot_step"]) == ("finished", 30)  # only last.pt: read torch-free
    data = json.loads((run / "run.json").read_text())
    data["config"]["trainer"]["max_updates"] = 60  # as if asked to train on to 60
    (run / "run.json").write_text(json.dumps(data))
    row = runs_json(tmp_path / "outputs")["short"]
    assert row["state_text"] == ("interrupted without a clean stop (last update seen 30, "
                                 "newest snapshot 30)")


def test_a_killed_run_is_interrupted_not_stopped(tmp_path: Path,
                                                endless_run_stopped: dict) -> None:
    """Catches a run killed (SIGKILL at update 20, newest snapshot 10) shown as "stopped at
    update 10" like a clean stop, or without the last update it recorded (19); a clean stop
    that a later resume superseded still counting as the run's end; and a run.json from
    before clean stops were recorded shown as stopped or interrupted instead of unknown."""
    root = tmp_path / "outputs"
    run = root / "killed"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="restarting:build_supervised_trainer",
                          **{"trainer.max_updates": 40, "trainer.save_every": 10,
                             "trainer.log_every": 1, "trainer.validate_every": 0,
                             "trainer.async_save": False, "data.train_size": 256,
                             "data.val_size": 64})
    env = factories_env(EMBODICHAIN_TEST_KILLS=json.dumps([{"id": "k", "rank": 0,
                                                            "update": 20}]),
                        EMBODICHAIN_TEST_KILL_LOG=str(tmp_path / "kills.log"))
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env)
    assert proc.returncode == -9, proc.stderr
    row = runs_json(root)["killed"]
    assert (row["state"], row["last_record_step"], row["snapshot_step"]) == \
        ("interrupted", 19, 10)
    assert row["state_text"] == ("interrupted without a clean stop (last update seen 19, "
                                 "newest snapshot 10)")

    stopped = root / "stopped_then_resumed"  # the clean stop, then a resume that was killed
    shutil.copytree(endless_run_stopped["run"], stopped)
    data = json.loads((stopped / "run.json").read_text())
    data["events"].append({"event": "resumed", "step": data["events"][-1]["step"]})
    (stopped / "run.json").write_text(json.dumps(data))
    assert runs_json(root)["stopped_then_resumed"]["state"] == "interrupted"

    for name in ("killed", "stopped_then_resumed"):  # as a run.json before the record
        data = json.loads((root / name / "run.json").read_text())
        del data["format_version"]
        data["events"] = [e for e in data["events"] if e["event"] != "stopped"]
        (root / name / "run.json").write_text(json.dumps(data))
    rows = runs_json(root)
    assert {rows[name]["state"] for name in rows} == {"unknown"}
    assert rows["killed"]["state_text"] == ("unknown: ended before clean stops were recorded "
                                            "(last update seen 19, newest snapshot 10)")


def test_not_a_directory(tmp_path: Path) -> None:
    proc = cli_in_process("runs", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")


def test_a_run_that_failed_says_so_with_its_error(tmp_path: Path) -> None:
    """Catches a failure (exit 1) shown as "interrupted", as a kill is, and a failed event
    that outlives the resume after it: a run whose data raises at example 2 (first drawn
    after its first snapshot, with this seed) is "failed at update N" with the error's
    first line; resumed without the fault and finished, it is finished."""
    from tests.support.data import data_env, data_recipe

    run = tmp_path / "outputs" / "bad"
    recipe = data_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 4,
                                                     "trainer.save_every": 1,
                                                     "trainer.batch_size": 4,
                                                     "data.train_size": 4})
    failed = run_cli("train-sl", "--config", str(recipe), "--no-progress",
                     env=data_env(EMBODICHAIN_TEST_FAIL_INDEX="2"))
    assert failed.returncode == 1, failed.stderr
    row = runs_json(tmp_path / "outputs")["bad"]
    assert row["state"] == "failed" and row["failed"]["step"] >= 2, row  # past a snapshot
    assert row["state_text"].startswith(f"failed at update {row['failed']['step']}: ")
    assert "corrupt record 2 (test)" in row["state_text"]
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--resume", "auto", "--no-progress",
                      env=data_env()))
    assert runs_json(tmp_path / "outputs")["bad"]["state"] == "finished"
