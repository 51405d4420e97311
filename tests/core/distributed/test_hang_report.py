"""R-OPS-1 in one process: the collective timeout's type, who is named as not arrived, the
stack file, and the watch's cost per update (none: no store request, no read) and timing.

The whole story, 2 gloo ranks with one frozen, is tests/recovery/test_stuck_rank.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from embodichain.core.distributed import hang_watch
from embodichain.core.distributed.hang_report import (
    end_if_stopped,
    message,
    not_arrived,
    process_state,
    stack_text,
)
from embodichain.core.distributed.hang_watch import HangWatch
from embodichain.core.recipe.durations import seconds_of
from embodichain.core.recipe.schema import FrameworkConfig
from embodichain.core.runs.resume_policy import config_differences
from tests.support.cli import invoke
from tests.support.recipes import write_recipe

WAITING = {"at": "torch/autograd/graph.py:979 in _engine_run_backward",
           "from": "embodichain/core/training/strategies/base.py:130 in accumulate"}


def _answer(update: int, at: str = WAITING["at"], caller: str = WAITING["from"]
            ) -> dict[str, Any]:
    return {"update": update, "where": {"at": at, "from": caller}, "stack": "..."}


@pytest.mark.parametrize(("value", "seconds"), [
    (300, 300.0), (2.5, 2.5), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1.5m", 90.0),
    ("45", 45.0)])
def test_a_duration_is_seconds_or_text_with_a_unit(value: object, seconds: float) -> None:
    """Catches a unit read wrongly (minutes as seconds) or a plain number refused."""
    assert seconds_of(value) == seconds


@pytest.mark.parametrize("value", [0, -3, "0s", "-3m", "5 minutes", "m", True, None, [1],
                                   float("inf")])
def test_a_duration_that_is_not_one_is_refused(value: object) -> None:
    """Catches a zero, negative, infinite or unparsable timeout accepted (a zero one would
    end every run at its second update)."""
    with pytest.raises(ValueError):
        seconds_of(value)


def test_validate_config_refuses_a_bad_collective_timeout_naming_the_key(tmp_path: Path
                                                                          ) -> None:
    """Catches a bad value that passes validate-config (to fail, or hang, at the run) or a
    refusal that does not say which key."""
    good = write_recipe(tmp_path / "good.yaml", tmp_path / "run",
                        **{"trainer.collective_timeout": "3m"})
    assert invoke("validate-config", str(good)).exit_code == 0
    bad = write_recipe(tmp_path / "bad.yaml", tmp_path / "run",
                       **{"trainer.collective_timeout": "3 minutes"})
    result = invoke("validate-config", str(bad))
    assert result.exit_code == 2, result.output
    assert "trainer.collective_timeout" in result.output and "'3 minutes'" in result.output


def test_a_checkpoint_from_before_the_key_resumes_and_the_key_may_change() -> None:
    """Catches the new key making older checkpoints unresumable, or a changed timeout
    refused on resume (it says when a hang is declared, not what is trained)."""
    current = FrameworkConfig.model_validate({
        "factory": "sl_ddp", "trainer": {"batch_size": 4, "max_updates": 5, "output_dir": "o"},
        "optimizer": {"name": "adam", "lr": 0.001}}).model_dump(mode="json")
    assert current["trainer"]["collective_timeout"] == 300.0
    older = {**current, "trainer": {k: v for k, v in current["trainer"].items()
                                    if k != "collective_timeout"}}
    assert config_differences(older, current, 0) == []
    longer = {**current, "trainer": {**current["trainer"], "collective_timeout": 1800.0}}
    assert config_differences(current, longer, 0) == []


def test_the_rank_that_does_not_answer_is_named_with_its_process() -> None:
    """Catches a frozen rank left out of the message, or named without what its node sees
    of its process."""
    origin = {"pid": os.getpid(), "host": os.uname().nodename}
    missing = not_arrived({0: _answer(45)}, 2, {1: origin})
    assert list(missing) == [1]
    assert missing[1].startswith(f"does not answer (pid {os.getpid()} on ")
    assert "state R (running)" in missing[1] or "state S (sleeping)" in missing[1]


def test_a_rank_behind_elsewhere_or_waiting_for_data_is_named_the_waiting_ones_not() -> None:
    """Catches naming the ranks that wait in the collective instead of the one that keeps
    them waiting (behind by an update, stuck in its own code, or waiting for a data worker)."""
    answers = {0: _answer(45), 1: _answer(44, "embodichain/core/training/learner.py:80 in x"),
               2: _answer(45, "mydata/reader.py:12 in read", "embodichain/core/data/a.py:9 in b"),
               3: _answer(45, "torch/utils/data/dataloader.py:1290 in _try_get_data"),
               4: _answer(45)}
    missing = not_arrived(answers, 5, {})
    assert list(missing) == [1, 2, 3]
    assert missing[1].startswith("is still in update 44, at embodichain/core/training/")
    assert missing[2] == ("is at mydata/reader.py:12 in read (called from "
                          "embodichain/core/data/a.py:9 in b)")
    assert missing[3].startswith("waits for its data workers: one hangs in the dataset's")


def test_where_no_rank_is_in_torch_the_place_most_share_is_the_wait() -> None:
    """On a GPU the waiting ranks block where the host first reads the device (outside
    torch's collectives): catches naming them all instead of the one elsewhere."""
    figures = "embodichain/core/training/figures.py:50 in act_on_lagged"
    answers = {0: _answer(9, figures, ""), 1: _answer(9, figures, ""),
               2: _answer(9, "mydata/reader.py:12 in read", "")}
    assert list(not_arrived(answers, 3, {})) == [2]


def test_the_message_names_ranks_update_place_and_how_to_continue(tmp_path: Path) -> None:
    """Catches a message without the update, the missing rank, rank 0's place, the stack
    files or the command that continues."""
    answers = {0: _answer(45)}
    missing = {1: "does not answer (pid 7 on n1): no stack from it"}
    said = message(answers, missing, 0, 4.0, tmp_path,
                   "the last snapshot is X/last.pt; continue with: torchrun ... resume X")
    assert said.startswith("training hangs: update 45 waited more than "
                           "trainer.collective_timeout (4 s) for the other ranks. Rank 1 did "
                           "not arrive: rank 1 does not answer (pid 7 on n1)")
    assert f"Rank 0 was waiting at {WAITING['at']} (called from {WAITING['from']})" in said
    assert f"{tmp_path / 'hang'}/rank_N.txt" in said
    assert said.endswith("The last snapshot is X/last.pt; continue with: torchrun ... resume X")
    assert "R-OPS" not in said
    assert process_state({"pid": 7, "host": "elsewhere"}) == "pid 7 on elsewhere"


def test_only_a_stopped_process_on_this_host_is_ended() -> None:
    """Catches a reporter that kills a running rank (one still able to take torchrun's
    SIGTERM and end cleanly), one on another host, or leaves a stopped one to torchrun's
    30-second grace."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        here = {"pid": child.pid, "host": socket.gethostname()}
        assert not end_if_stopped(here) and child.poll() is None  # running: left alone
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.2)
        assert not end_if_stopped({**here, "host": "elsewhere"}) and child.poll() is None
        assert "state T (stopped)" in process_state(here)
        assert end_if_stopped(here)
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert not end_if_stopped(here)  # gone
    finally:
        child.kill()
        child.wait(timeout=10)


def test_the_stack_holds_the_main_thread_and_every_thread() -> None:
    """Catches a stack file without the training thread's stack (the one that matters)."""
    text = stack_text("rank 3 of 4, update 9", threading.get_ident())
    assert text.startswith("rank 3 of 4, update 9\n\nThe main thread (0x")
    assert "in test_the_stack_holds_the_main_thread_and_every_thread" in text
    assert "Every thread (faulthandler):" in text and "Current thread 0x" in text


class _Store:
    """A TCPStore's API in memory, counting the requests."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.requests = 0

    def set(self, key: str, value: str) -> None:
        self.requests += 1
        self.values[key] = value.encode()

    def get(self, key: str) -> bytes:
        self.requests += 1
        return self.values[key]

    def check(self, keys: list[str]) -> bool:
        self.requests += 1
        return all(k in self.values for k in keys)


def _watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout_s: float
           ) -> tuple[HangWatch, _Store, threading.Event]:
    ended = threading.Event()
    watches: list[HangWatch] = []

    def exit_here(code: int) -> None:  # instead of ending pytest's process: the thread ends
        assert code == 1
        ended.set()
        watches[0].close()

    monkeypatch.setattr(hang_watch.os, "_exit", exit_here)
    store = _Store()
    watches.append(HangWatch(timeout_s, tmp_path, lambda: "no snapshot was saved yet",
                             lambda update, said: None, store, "p/"))
    return watches[0], store, ended


def test_an_update_costs_the_loop_no_store_request(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a watch that asks the store (or the device) at every update: 2000 updates in
    well under the store's poll period make no request beyond the origin said at start."""
    watch, store, ended = _watch(tmp_path, monkeypatch, 60.0)
    try:
        before = store.requests
        for update in range(1, 2001):
            watch.progress(update)
        assert store.requests - before <= 1  # at most the watch thread's own alarm check
    finally:
        watch.close()
    assert not ended.is_set()


def test_the_watch_fires_after_the_timeout_but_not_in_the_first_update_or_a_pause(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """Catches a watch that counts the first update (compilation), a validation or save, or
    that never fires; when it fires: the stack file, the store's words, the message."""
    watch, store, ended = _watch(tmp_path, monkeypatch, 0.4)
    try:
        watch.progress(1)  # the first update of a start: not counted
        assert not ended.wait(0.8)
        watch.progress(2)
        with watch.paused():  # a validation or a save
            assert not ended.wait(0.8)
        assert not ended.wait(0.8)  # after it (the end's save), until the next update starts
        watch.progress(3)
        assert ended.wait(5.0), "the watch never fired"
    finally:
        watch.close()
    text = (tmp_path / "hang" / "rank_0.txt").read_text()
    assert text.startswith("rank 0 of 1, update 3, pid ")
    assert "in test_the_watch_fires_after_the_timeout" in text  # where the loop waited
    assert {"p/hang/origin_0", "p/hang/rank_0", "p/hang/alarm", "p/hang/spoken"} <= set(
        store.values)
    said = capsys.readouterr().err
    assert said.startswith("error: training hangs: update 3 waited more than "
                           "trainer.collective_timeout (0.4 s)"), said


def test_another_ranks_alarm_makes_this_rank_write_its_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a live rank that keeps quiet when another rank called the hang (its stack
    would be missing although it could have written it)."""
    watch, store, ended = _watch(tmp_path, monkeypatch, 600.0)
    try:
        store.values["p/hang/alarm"] = b"1"
        started = time.monotonic()
        assert ended.wait(5.0)
        assert time.monotonic() - started < hang_watch.STORE_POLL_S + hang_watch.ANSWER_S + 1
    finally:
        watch.close()
    assert (tmp_path / "hang" / "rank_0.txt").exists()


def test_torchs_own_timeout_stays_behind_a_longer_collective_timeout(tmp_path: Path) -> None:
    """Catches gloo's 30 minutes (NCCL's 10) ending a run whose collective_timeout is
    longer before the watch can name the stuck rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        hang_watch._keep_torch_timeout_behind(60.0)  # shorter than torch's own: kept
        assert gloo.options._timeout.total_seconds() == 1800
        hang_watch._keep_torch_timeout_behind(3600.0)
        assert gloo.options._timeout.total_seconds() == 3600 + hang_watch.BACKSTOP_S
    finally:
        dist.destroy_process_group()
