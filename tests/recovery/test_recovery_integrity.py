"""R-CKPT-3/4/7 and the metrics.jsonl torn-line policy.

Hostile files never run code (also with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1), damaged files give
CheckpointCorruptError (exit 2 on the command line, never a traceback), step files are ordered
by number, and a torn final metrics line is ignored by readers and set aside on resume in place.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import payload_digest, read_checkpoint
from embodichain.core.checkpoint.names import step_files
from embodichain.core.errors import CheckpointCorruptError, UnsafeCheckpointError
from embodichain.core.runs.run_dir import read_metrics
from tests.support import assert_ok, run_cli, snapshot_dir, worker_env, write_recipe
from tests.support.cli import cli_in_process
from tests.support.recovery import metrics, run_json

FORCE_UNSAFE = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}


# -- R-CKPT-3: pickle payloads are refused and never run -----------------------------------------


class _Payload:
    """Unpickling this creates the directory `marker`: proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.fixture()
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "payload-ran"
    path = tmp_path / "hostile" / "step_100.pt"
    path.parent.mkdir()
    genuine_manifest = {"format": "embodichain.checkpoint", "format_version": 1, "step": 100}
    torch.save({"manifest": genuine_manifest, "payload": {"run": _Payload(marker)}}, path)
    # the file is live: an unsafe load really would run it
    torch.load(path, weights_only=False)
    assert marker.is_dir()
    marker.rmdir()
    return path, marker


def test_pickle_payload_is_refused_in_process(hostile: tuple[Path, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path, marker = hostile
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(UnsafeCheckpointError, match="refusing to load .* arbitrary unpickling"):
        read_checkpoint(path)
    assert not marker.exists()


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_pickle_payload_is_refused_by_inspect_and_resume(hostile: tuple[Path, Path],
                                                         tmp_path: Path) -> None:
    path, marker = hostile
    env = worker_env(**FORCE_UNSAFE)
    before = snapshot_dir(path.parent)
    proc = run_cli("inspect-checkpoint", str(path), env=env)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to load" in proc.stderr and "Traceback" not in proc.stderr

    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "dest")
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(path), "--no-progress",
                   env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("refusing to load") == 1 and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "dest").exists()
    assert snapshot_dir(path.parent) == before


# -- R-CKPT-4: truncation and flipped bytes --------------------------------------------------------


def _reference(path: Path) -> tuple[str, dict]:
    data = read_checkpoint(path)
    return payload_digest(data["payload"]), data["manifest"]


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_truncations_are_a_named_corruption(sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """Every cut raises CheckpointCorruptError: every byte of the first 128 (the first local
    header, the magic), of the first 64 of every member's local header, and of the central
    directory and end record (where readers take different paths), and a seeded sample of
    the bytes between (member data: a cut there only loses the end record)."""
    data = (sl_ddp_two_workers / "step_100.pt").read_bytes()
    n = len(data)
    central = data.index(b"PK\x01\x02")
    members = [i for i in range(central) if data.startswith(b"PK\x03\x04", i)]
    assert len(members) > 20
    structure = {*range(128), *range(central, n),
                 *(i for start in members for i in range(start, min(start + 64, n)))}
    between = sorted(set(range(n)) - structure)
    cuts = sorted({0, 1, 2, 4, 22, 100, n // 2, n - 100, n - 23, n - 22, n - 2, n - 1,
                   *structure, *random.Random(7).sample(between, 300)})
    target = tmp_path / "cut.pt"
    for cut in cuts:
        target.write_bytes(data[:cut])
        with pytest.raises(CheckpointCorruptError, match="corrupt"):
            read_checkpoint(target)


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_flipped_bytes_are_detected_or_harmless(sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    """Every flip either raises CheckpointCorruptError or leaves the loaded content identical
    (a flip in zip padding): every byte of the zip central directory and of the first local
    header, the directory attribute of every member, and a seeded sample of the rest."""
    source = sl_ddp_two_workers / "step_100.pt"
    digest, manifest = _reference(source)
    data = source.read_bytes()
    n = len(data)
    central = data.index(b"PK\x01\x02")
    entries = [i for i in range(central, n) if data.startswith(b"PK\x01\x02", i)]
    assert len(entries) > 20
    flips = {(i, 0xFF) for i in range(central, n)} | {(i, 0xFF) for i in range(64)}
    flips |= {(entry + 38, 0x10) for entry in entries}  # "is a directory" attribute
    flips |= {(i, 0x01) for i in random.Random(7).sample(range(n), 300)}
    target = tmp_path / "flip.pt"
    detected = 0
    for offset, mask in sorted(flips):
        damaged = bytearray(data)
        damaged[offset] ^= mask
        target.write_bytes(damaged)
        try:
            loaded = read_checkpoint(target)
        except CheckpointCorruptError:
            detected += 1
            continue
        assert payload_digest(loaded["payload"]) == digest, f"offset {offset} mask {mask:#x}"
        assert loaded["manifest"] == manifest, f"offset {offset} mask {mask:#x}"
    assert detected > 0.8 * len(flips)


def test_damaged_files_on_the_command_line(sl_ddp_two_workers: Path, tmp_path: Path) -> None:
    data = (sl_ddp_two_workers / "step_100.pt").read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    flipped = tmp_path / "flipped.pt"
    damaged = bytearray(data)
    damaged[len(data) // 2] ^= 0x10  # inside the tensor data
    flipped.write_bytes(damaged)
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "dest")
    for path in (truncated, flipped):
        proc = cli_in_process("inspect-checkpoint", str(path))
        assert proc.returncode == 2 and "corrupt" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_cli("train-sl", "--config", str(recipe), "--resume", str(flipped), "--no-progress")
    assert proc.returncode == 2 and proc.stderr.count("is corrupt") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "dest").exists()


def test_checkpoints_are_standard_torch_files(sl_ddp_two_workers: Path) -> None:
    """`torch.load(weights_only=True)` opens one in a notebook, manifest included."""
    data = torch.load(sl_ddp_two_workers / "step_100.pt", weights_only=True)
    assert data["manifest"]["step"] == 100 and data["manifest"]["world_size"] == 2
    assert data["manifest"]["payload_sha256"] == payload_digest(data["payload"])


# -- R-CKPT-7: ordering ---------------------------------------------------------------------------


def test_step_files_are_ordered_by_step_number_not_name_or_time(tmp_path: Path) -> None:
    steps = [100, 20, 3, 1000, 25]
    now = time.time()
    for age, step in enumerate(steps):  # step_100.pt is the newest file, step_25.pt the oldest
        path = tmp_path / f"step_{step}.pt"
        path.write_bytes(b"")
        os.utime(path, (now - age * 60, now - age * 60))
    for other in ("last.pt", "best.pt", "step_x.pt", "step_.pt", "step_7.pt.123.tmp",
                  ".step_9.pt.1.tmp", "step_5.ptx"):
        (tmp_path / other).write_bytes(b"")
    assert step_files(tmp_path) == [(s, tmp_path / f"step_{s}.pt") for s in sorted(steps)]
    # neither name order nor file time would give that order
    numbered = [tmp_path / f"step_{s}.pt" for s in steps]
    assert [p.name for p in sorted(numbered)] == [
        "step_100.pt", "step_1000.pt", "step_20.pt", "step_25.pt", "step_3.pt"]
    assert [p.name for p in sorted(numbered, key=lambda p: p.stat().st_mtime)] == [
        "step_25.pt", "step_1000.pt", "step_3.pt", "step_20.pt", "step_100.pt"]


# -- metrics.jsonl: the torn-line policy ----------------------------------------------------------


TORN = b'{"step":201,"train/loss":0.2'


def _torn_copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)  # copies: the shared session run stays as it is
    with open(dst / "metrics.jsonl", "ab") as f:
        f.write(TORN)
    return dst


def _check_torn_moved(run: Path, original: list[dict], extra_steps: list[int]) -> None:
    log = read_metrics(run / "metrics.jsonl")
    assert log.torn is None and not log.bad_lines
    assert log.records[: len(original)] == original
    assert [r["step"] for r in log.records[len(original):]] == extra_steps
    assert (run / "metrics.torn.jsonl").read_bytes() == TORN + b"\n"
    events = run_json(run)["events"]
    assert len(events) == 1 and events[0]["event"] == "resumed"
    assert events[0]["torn_metrics_line_moved_to"] == "metrics.torn.jsonl"


def test_torn_last_line_is_ignored_by_readers(sl_ddp_one_process: Path, tmp_path: Path) -> None:
    run = _torn_copy(sl_ddp_one_process, tmp_path / "run")
    log = read_metrics(run / "metrics.jsonl")
    assert log.torn == TORN.decode()
    assert log.records == metrics(sl_ddp_one_process) and not log.bad_lines
    # damaged bytes anywhere never make the reader raise
    (run / "metrics.jsonl").write_bytes(b'{"step":1}\n\xff\xfe{not json\n[1,2]\n{"step":2}\n{"st')
    log = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in log.records] == [1, 2] and log.bad_lines == [2, 3]
    assert log.torn == '{"st'


def test_resume_command_moves_a_torn_line_aside(sl_ddp_one_process: Path, tmp_path: Path) -> None:
    run = _torn_copy(sl_ddp_one_process, tmp_path / "run")
    original = metrics(sl_ddp_one_process)
    assert_ok(run_cli("resume", str(run), "--set", "trainer.max_updates=210", "--no-progress"))
    _check_torn_moved(run, original, [210])
    assert read_checkpoint(run / "last.pt")["manifest"]["step"] == 210


def test_train_resume_in_place_moves_a_torn_line_aside(sl_ddp_one_process: Path,
                                                       tmp_path: Path) -> None:
    run = _torn_copy(sl_ddp_one_process, tmp_path / "run")
    original = metrics(sl_ddp_one_process)
    recipe = write_recipe(tmp_path / "r.yaml", run, **{"trainer.max_updates": 210})
    assert_ok(run_cli("train-sl", "--config", str(recipe), "--resume", str(run / "last.pt"),
                      "--no-progress"))
    _check_torn_moved(run, original, [210])
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 210
