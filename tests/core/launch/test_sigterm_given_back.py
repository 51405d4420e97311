"""A program that calls `train()` under a process group and sees it refused or failed gets
its SIGTERM handler back (issue 48, point 7).

A refused or failed distributed run ignores SIGTERM (torchrun's closing signal must not turn
the run's exit code into -15); the CLI's process keeps it so until it exits, but a program
goes on. In this process, under a group of one (gloo) made by the test, as a program under
torchrun would have one. Catches the handler left as SIG_IGN after `train()` raised (the
program can no longer be stopped by SIGTERM), for the factory's refusal
(core/launch/train.py) and for a failed validation (core/distributed/process_group.py).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import FACTORIES, write_recipe


@pytest.fixture()
def group_of_one() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _own_handler(signum: int, frame: object) -> None:
    pass


@pytest.mark.parametrize("factory, error", [
    ("refusing_data:refuses", "UsageError"),  # the factory refuses: exit 2 in the CLI
    ("failing_validation:everywhere", "TrainingError"),  # rank 0's validation fails: exit 1
])
def test_a_failed_programmatic_run_gives_sigterm_back(
        factory: str, error: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        group_of_one: None) -> None:
    from embodichain.core import errors
    from embodichain.learning import sl

    monkeypatch.syspath_prepend(str(FACTORIES))
    recipe = sl.load_recipe(write_recipe(
        tmp_path / "r.yaml", tmp_path / "run", factory=factory, **{
            "trainer.max_updates": 2, "trainer.validate_every": 1, "trainer.save_every": 0}))
    signal.signal(signal.SIGTERM, _own_handler)  # the conftest puts pytest's back
    with pytest.raises(getattr(errors, error)):
        sl.train(recipe, show_progress=False)
    assert signal.getsignal(signal.SIGTERM) is _own_handler
