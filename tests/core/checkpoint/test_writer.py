"""core/checkpoint/writer.py in one process: the staged copy, failures, the save clock."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint import writer as writer_module
from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.writer import (
    SAVE_DUE,
    SAVE_FAILED,
    CheckpointWriter,
    FileSave,
    SaveClock,
    StagingArea,
    rank_zero_note,
)
from embodichain.core.runs.resume_policy import config_differences


def payload(step: int, weight: torch.Tensor) -> dict:
    return {"run": {"step": step, "run_id": "r", "world_size": 1, "config_sha256": "c"},
            "learner": {"model": {"w": weight}, "optimizer": {"state": {0: {"step": weight[0]}}}},
            "ranks": {0: {"python": [3, (1, 2), None]}}}


def test_the_staged_copy_is_the_boundarys_and_reuses_its_buffers() -> None:
    """Catches a copy that aliases the live tensors (CPU ones included) and one that
    allocates anew at every save."""
    live = torch.arange(6, dtype=torch.float32)
    area = StagingArea()
    first = area.copy(payload(1, live))
    buffer = first["learner"]["model"]["w"]
    live.add_(100)  # the next update changes the live tensors in place
    assert torch.equal(buffer, torch.arange(6, dtype=torch.float32))
    assert buffer.data_ptr() != live.data_ptr()
    second = area.copy(payload(2, live))
    assert second["learner"]["model"]["w"] is buffer  # the same buffer, refilled
    assert torch.equal(buffer, live)
    assert second["ranks"][0]["python"] == [3, (1, 2), None]
    assert area.nbytes == 6 * 4 + 4  # w and the 0-d step


def test_a_background_write_is_published_and_verifies(tmp_path: Path) -> None:
    writer = CheckpointWriter(background=True)
    order: list[str] = []
    writer.write(FileSave(payload(3, torch.ones(4)), tmp_path / "step_3.pt",
                          also_as=tmp_path / "last.pt",
                          before_publish=lambda: order.append("metrics durable"),
                          after_publish=lambda: order.append("retention")))
    assert writer.settle() is None
    assert order == ["metrics durable", "retention"]
    for name in ("step_3.pt", "last.pt"):
        assert read_checkpoint(tmp_path / name)["manifest"]["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step_3.pt"]


def test_a_failed_background_write_is_kept_named_and_stops_further_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from the rename (tests run as root: a read-only directory would not refuse);
    catches a failure lost in the thread, or a later save written after it."""
    real_replace = os.replace

    def full_disk(src, dst, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_disk)
    writer = CheckpointWriter(background=True)
    writer.write(FileSave(payload(5, torch.ones(2)), tmp_path / "step_5.pt"))
    failure = writer.settle()
    assert failure is not None and failure.path == tmp_path / "step_5.pt"
    assert failure.message.startswith(f"saving checkpoint {tmp_path / 'step_5.pt'} failed on "
                                      "rank 0: the disk is full (No space left on device): "
                                      "the checkpoint needs ")
    assert failure.message.endswith(f" ({tmp_path / 'step_5.pt'})")
    assert rank_zero_note(writer, SaveClock(None)) == SAVE_FAILED
    writer.write(FileSave(payload(6, torch.ones(2)), tmp_path / "step_6.pt"))
    assert writer.settle() is failure
    assert list(tmp_path.iterdir()) == []  # nothing published, no temp file left


def test_an_inline_write_fails_at_once_naming_the_file(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches an inline failure lost (the trainer reads `failure` right after the write)."""
    def fail(*args, **kwargs):
        raise OSError(errno.EACCES, "Permission denied", str(tmp_path / "x"))

    monkeypatch.setattr(writer_module, "write_checkpoint", fail)
    writer = CheckpointWriter(background=False)
    writer.write(FileSave(payload(1, torch.ones(1)), tmp_path / "a.pt"))
    assert writer.failure is not None and writer.failure.path == tmp_path / "a.pt"
    assert writer.failure.reason == f"Permission denied ({tmp_path / 'x'})"


def test_one_save_in_flight_at_most(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second write waits for the first (which holds the staging buffers)."""
    release, started = threading.Event(), threading.Event()
    real = writer_module.write_checkpoint

    def held(*args, **kwargs):
        started.set()
        assert release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_checkpoint", held)
    writer = CheckpointWriter(background=True)
    writer.write(FileSave(payload(1, torch.ones(3)), tmp_path / "step_1.pt"))
    assert started.wait(30)
    second = threading.Thread(target=writer.write,
                              args=(FileSave(payload(2, torch.full((3,), 2.0)),
                                             tmp_path / "step_2.pt"),))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first write
    release.set()
    second.join(30)
    assert writer.settle() is None
    assert read_checkpoint(tmp_path / "step_1.pt")["manifest"]["step"] == 1
    assert torch.equal(read_checkpoint(tmp_path / "step_2.pt")["payload"]["learner"]["model"]["w"],
                       torch.full((3,), 2.0))


def test_the_save_clock() -> None:
    clock = SaveClock(0.05)
    writer = CheckpointWriter(background=True)
    assert rank_zero_note(writer, clock) == 0.0
    time.sleep(0.06)
    assert clock.due() and rank_zero_note(writer, clock) == SAVE_DUE
    clock.restart()
    assert not clock.due()
    assert not SaveClock(None).due()


def test_async_save_and_save_every_s_are_resumable_changes() -> None:
    saved = {"trainer": {"batch_size": 32, "async_save": True, "save_every_s": None}}
    changed = {"trainer": {"batch_size": 32, "async_save": False, "save_every_s": 60.0}}
    assert config_differences(saved, changed, 0) == []
    before_the_keys = {"trainer": {"batch_size": 32}}
    assert config_differences(before_the_keys, saved, 0) == []
