"""R-DIST-1: `distributed_run` creates (and destroys) only the group it needs and owns.

Under torchrun the checks run in real gloo workers (tests/scripts/distributed_run_check.py,
which records what each rank saw); the single-process checks run here, in the test process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from embodichain.core.distributed.process_group import resolve_device
from embodichain.core.errors import UsageError
from embodichain.core.training.learner import Learner
from embodichain.learning.sl import OptimizerConfig, distributed_run
from tests.support import TESTS, assert_ok, run_torchrun, worker_env

SCRIPTS = TESTS / "scripts"


def scripts_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    return worker_env(PYTHONPATH=path)


def launch_check(out: Path, *args: str, nproc: int = 2) -> list[dict]:
    assert_ok(run_torchrun(str(out), *args, nproc=nproc, module="distributed_run_check",
                           env=scripts_env()))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return launch_check(tmp_path_factory.mktemp("distributed_run"))


@pytest.mark.slow
def test_no_group_exists_before(ranks):
    assert [r["before"] for r in ranks] == [False, False]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["own", "exception", "auto"])
def test_creates_a_gloo_group_and_destroys_it(ranks, scenario):
    for rank, seen in enumerate(ranks):
        got = seen[scenario]
        assert got["initialized"] is True
        assert got["backend"] == "gloo"
        assert (got["world_size"], got["rank"]) == (2, rank)
        assert got["sum"] == 3.0  # the group works: all_reduce of rank + 1 over both ranks
        assert got["device"] == "cpu"
        assert got["after"] is False, f"rank {rank}: group left behind after {scenario!r}"


@pytest.mark.slow
def test_an_exception_propagates_and_the_group_is_still_destroyed(ranks):
    for seen in ranks:
        assert seen["exception"]["propagated"] == "from inside the block"
        assert seen["exception"]["after"] is False


@pytest.mark.slow
def test_a_pre_existing_group_stays_the_callers(ranks):
    for seen in ranks:
        got = seen["preexisting"]
        assert got["initialized"] and got["same_group"]
        assert got["sum"] == 3.0
        assert got["after"] is True and got["usable_after"] == 2.0
        assert got["after_exception"] is True and got["usable_after_exception"] == 2.0


@pytest.mark.skipif(torch.cuda.device_count() == 0, reason="needs a CUDA GPU")
def test_cuda_uses_nccl_and_one_gpu_per_local_rank(tmp_path):
    nproc = min(2, torch.cuda.device_count())
    for rank, seen in enumerate(launch_check(tmp_path, "cuda", nproc=nproc)):
        assert seen["backend"] == "nccl"
        assert seen["device"] == f"cuda:{rank}" and seen["current_device"] == rank
        assert seen["sum"] == sum(range(1, nproc + 1))
        assert seen["after"] is False


# -- one process -----------------------------------------------------------------------------


@pytest.fixture()
def single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert not dist.is_initialized()
    yield
    assert not dist.is_initialized()


def test_single_process_creates_no_group(single_process):
    with distributed_run("cpu") as device:
        assert device == torch.device("cpu")
        assert not dist.is_initialized()
        learner = Learner(torch.nn.Linear(2, 1), OptimizerConfig(name="sgd", lr=0.1), None, 1,
                          device)
        assert learner.wrapped is learner.model  # no DDP without a group
    assert not dist.is_initialized()


def test_single_process_exception_propagates(single_process):
    with pytest.raises(KeyError, match="inside"), distributed_run("cpu"):
        raise KeyError("inside")


def test_auto_resolves_to_cuda_when_available_else_cpu(single_process):
    with distributed_run("auto") as device:
        expected = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        assert device == expected


def test_cuda_without_cuda_is_a_usage_error_before_any_group(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun: still no group may be created
    with pytest.raises(UsageError, match="CUDA is not available"), distributed_run("cuda"):
        pytest.fail("the block must not run")
    assert not dist.is_initialized()


def test_cuda_maps_local_rank_within_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES=4,6"):
        resolve_device("cuda")


def test_unknown_device_is_a_usage_error():
    with pytest.raises(UsageError, match="cpu, cuda or auto"):
        resolve_device("tpu")
