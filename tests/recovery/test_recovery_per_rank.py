"""R-CKPT-5: every rank gets its own RNG streams, sampler position and buffers back.

`recovery_factories:per_rank_draws` draws torch, Python and NumPy random numbers in the
objective on both ranks, more of them on rank 1, logs them per rank, and keeps a per-rank
buffer. After resuming from step 20, each rank's next draws must be the very numbers it drew
at the same updates of the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from embodichain.core.checkpoint.file import read_checkpoint
from tests.recovery.recovery_factories import DRAWS_ENV
from tests.support import assert_ok, run_torchrun, write_recipe
from tests.support.recovery import assert_training_state_equal, factory_env

pytestmark = pytest.mark.slow  # every test here launches torchrun workers

GUARD = 240
FACTORY = "recovery_factories:per_rank_draws"
STEPS, SNAPSHOT = 40, 20


def _draws(directory: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (directory / f"rank{rank}.jsonl").read_text().splitlines()]


def test_each_rank_resumes_its_own_random_streams_and_buffers(tmp_path: Path) -> None:
    changes = {"trainer.max_updates": STEPS, "trainer.save_every": SNAPSHOT,
               "trainer.validate_every": SNAPSHOT, "trainer.log_every": 5}
    draws_a, draws_b = tmp_path / "draws_a", tmp_path / "draws_b"
    draws_a.mkdir()
    draws_b.mkdir()

    recipe_a = write_recipe(tmp_path / "a.yaml", tmp_path / "a", factory=FACTORY, **changes)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe_a), "--no-progress",
                           env=factory_env(**{DRAWS_ENV: str(draws_a)}), timeout=GUARD))
    recipe_b = write_recipe(tmp_path / "b.yaml", tmp_path / "b", factory=FACTORY, **changes)
    assert_ok(run_torchrun("train-sl", "--config", str(recipe_b), "--resume",
                           str(tmp_path / "a" / f"step_{SNAPSHOT}.pt"), "--no-progress",
                           env=factory_env(**{DRAWS_ENV: str(draws_b)}), timeout=GUARD))

    for rank in (0, 1):
        uninterrupted, resumed = _draws(draws_a, rank), _draws(draws_b, rank)
        assert len(uninterrupted) == STEPS and len(resumed) == STEPS - SNAPSHOT
        assert resumed == uninterrupted[SNAPSHOT:], f"rank {rank} drew different numbers"
    # not vacuous: the ranks' streams differ, and rank 1 consumed more of each of them
    assert _draws(draws_a, 0)[SNAPSHOT:] != _draws(draws_a, 1)[SNAPSHOT:]
    assert all("extra" in d for d in _draws(draws_a, 1))
    assert not any("extra" in d for d in _draws(draws_a, 0))

    snapshot = read_checkpoint(tmp_path / "a" / f"step_{SNAPSHOT}.pt")["payload"]["ranks"]
    assert not torch.equal(snapshot[0]["rng"]["torch_cpu"], snapshot[1]["rng"]["torch_cpu"])
    assert snapshot[0]["rng"]["python"] != snapshot[1]["rng"]["python"]
    assert not torch.equal(snapshot[0]["rng"]["numpy"]["keys"], snapshot[1]["rng"]["numpy"]["keys"])
    assert not torch.equal(snapshot[0]["buffers"]["seen"], snapshot[1]["buffers"]["seen"])

    # and the final states (model, optimizer, each rank's RNG, sampler, buffer) are bitwise equal
    for name in (f"step_{STEPS}.pt", "last.pt"):
        assert_training_state_equal(tmp_path / "a" / name, tmp_path / "b" / name)
    final = read_checkpoint(tmp_path / "b" / "last.pt")["payload"]["ranks"]
    assert not torch.equal(final[0]["buffers"]["seen"], final[1]["buffers"]["seen"])
