"""The ALOHA tests' tiny recipe: the transfer-cube example shrunk to a few updates of a
small model on a 2-episode dataset, judged on 2 short closed-loop episodes."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import REPO
from tests.support.recipes import write_recipe

EXAMPLE = REPO / "examples" / "learning" / "aloha" / "transfer_cube.yaml"
UPDATES = 6

SHRUNK = {"device": "cpu", "trainer.batch_size": 4, "trainer.global_batch_size": 8,
          "trainer.max_updates": UPDATES, "trainer.save_every": 3,
          "trainer.validate_every": UPDATES, "trainer.log_every": 1,
          "scheduler.warmup_updates": 2, "model.hidden": 32, "model.heads": 4,
          "model.feedforward": 64, "data.chunk": 10, "evaluation.episodes": 2,
          "evaluation.max_steps": 25, "evaluation.envs_per_rank": 1}


def tiny_recipe(path: Path, data: Path, output_dir: Path, **changes: object) -> Path:
    """The example recipe, shrunk; `changes` as dotted keys (`data.task="insertion"`)."""
    return write_recipe(path, output_dir, base=EXAMPLE,
                        **{**SHRUNK, "data.root": str(data), **changes})
