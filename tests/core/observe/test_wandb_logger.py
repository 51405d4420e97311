"""`trainer.loggers: [jsonl, wandb]` offline, and third-party loggers (R-OBS-3).

wandb is not mocked: runs write offline (`WANDB_MODE=offline`, `WANDB_DIR` in tmp) and the
test reads back the `.wandb` files wandb wrote: a LevelDB-style log of wandb's own protobuf
`Record`s (wandb.proto.wandb_internal_pb2), one file per process that logged.
"""

from __future__ import annotations

import json
import struct
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from embodichain.core.runs.run_dir import read_metrics
from tests.support import FACTORIES, assert_ok, run_cli, run_torchrun, worker_env, write_recipe

pytest.importorskip("wandb")


def wandb_records(path: Path) -> Iterator[bytes]:
    """The records of a `.wandb` file: a 7-byte `:W&B` header, then LevelDB log blocks of
    32 KiB whose chunks (checksum, length, type) are whole (1) or first/middle/last (2-4)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk


def read_wandb(root: Path) -> list[dict]:
    """Per offline process (by start time): its run id and its history rows."""
    from wandb.proto import wandb_internal_pb2 as pb

    sessions = []
    for path in sorted(root.glob("wandb/offline-run-*/run-*.wandb")):
        session: dict = {"run_id": None, "rows": []}
        for raw in wandb_records(path):
            record = pb.Record()
            record.ParseFromString(raw)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                session["run_id"] = record.run.run_id
            elif kind == "history":
                session["rows"].append({item.key or "/".join(item.nested_key):
                                        json.loads(item.value_json)
                                        for item in record.history.item})
        sessions.append(session)
    return sessions


def wandb_env(root: Path, **extra: str) -> dict[str, str]:
    return worker_env(WANDB_MODE="offline", WANDB_DIR=str(root), WANDB_SILENT="true",
                      WANDB_PROJECT="embodichain-tests", PYTHONPATH=str(FACTORIES), **extra)


@pytest.mark.slow
def test_a_continued_run_logs_into_the_same_wandb_run_with_increasing_steps(
        tmp_path: Path) -> None:
    """2 workers crash at update 151 (snapshot at 100), `resume` finishes 200, `--resume
    auto` trains on to 250. Catches a logger on every rank (two offline runs per launch),
    a new wandb run per process, and a continued run re-sending the steps 101..150 of the
    rolled-back tail (wandb's steps would go back)."""
    wandb_dir = tmp_path / "wandb_root"
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, factory="interrupting:build_supervised_trainer",
                          **{"trainer.loggers": ["jsonl", "wandb"]})
    crashed = run_torchrun("train-sl", "--config", str(recipe), "--no-progress",
                           env=wandb_env(wandb_dir, EMBODICHAIN_TEST_FAIL_AT="151"))
    assert crashed.returncode == 1, crashed.stderr
    assert_ok(run_torchrun("resume", str(run), "--no-progress", env=wandb_env(wandb_dir)))
    assert_ok(run_torchrun("train-sl", "--config", str(recipe), "--resume", "auto",
                           "--set", "trainer.max_updates=250", "--no-progress",
                           env=wandb_env(wandb_dir)))

    identity = json.loads((run / "run.json").read_text())
    assert identity["wandb"] == {"id": identity["run_id"], "project": "embodichain-tests"}
    sessions = read_wandb(wandb_dir)
    assert len(sessions) == 3  # one per launch: rank 0 only
    assert {s["run_id"] for s in sessions} == {identity["run_id"]}
    steps = [row["_step"] for s in sessions for row in s["rows"]]
    assert steps == sorted(set(steps)), steps  # strictly increasing across processes
    records = read_metrics(run / "metrics.jsonl").records
    assert set(steps) == {r["step"] for r in records}
    logged = {row["_step"]: row for s in sessions for row in s["rows"]}
    for record in records:  # the first process's 101..150 are the figures the record holds
        for key in ("train/loss", "validation/mse"):
            if key in record:
                assert logged[record["step"]][key] == pytest.approx(record[key], rel=1e-12)


def test_third_party_loggers_register_by_entry_point(tmp_path: Path) -> None:
    """A logger of a throwaway distribution (a dist-info on PYTHONPATH) named in
    trainer.loggers gets every record; an unknown name is refused before training. Catches
    a closed list of logger names, or one that ignores the entry-point group."""
    plugin = tmp_path / "plugin"
    info = plugin / "recording_logger-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: recording-logger\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[embodichain.loggers]\n"
                                           "recording = recording_logger:make\n")
    (plugin / "recording_logger.py").write_text(textwrap.dedent("""\
        import json

        class Recording:
            def __init__(self, directory, identity, start_step):
                self.file = open(directory / "recorded.jsonl", "a")
                self.file.write(json.dumps({"run_id": identity["run_id"],
                                            "start_step": start_step}) + "\\n")
            def write(self, record):
                self.file.write(json.dumps(record) + "\\n")
            def sync(self):
                self.file.flush()
            def close(self):
                self.file.close()

        def make(directory, identity, start_step):
            return Recording(directory, identity, start_step)
        """))
    env = worker_env(PYTHONPATH=str(plugin))
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", run, **{
        "trainer.loggers": ["jsonl", "recording"], "trainer.max_updates": 60,
        "trainer.validate_every": 30, "trainer.save_every": 0})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--no-progress", env=env))
    head, *recorded = [json.loads(line) for line in (run / "recorded.jsonl").read_text()
                       .splitlines()]
    assert head == {"run_id": json.loads((run / "run.json").read_text())["run_id"],
                    "start_step": None}
    assert recorded == read_metrics(run / "metrics.jsonl").records

    bad = write_recipe(tmp_path / "bad.yaml", tmp_path / "bad", **{
        "trainer.loggers": ["jsonl", "recordin"]})
    proc = run_cli("validate-config", str(bad), env=env)
    assert proc.returncode == 2
    assert "unknown logger 'recordin'; did you mean 'recording'?" in proc.stdout + proc.stderr
