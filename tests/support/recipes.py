"""Recipes for tests: the CPU example with changes, and the test factories' recipes."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.processes import CPU_RECIPE

# The recovery-by-restart recipe (tests/factories/restarting.py: sl_ddp with test-controlled
# kills, pauses and blocks; without them it trains exactly like sl_ddp).
RESTART_RECIPE = {"factory": "restarting:build_supervised_trainer", "trainer.max_updates": 300,
                  "trainer.save_every": 40, "trainer.validate_every": 50, "trainer.log_every": 10}

# Short runs for kill points: a save after every update, no validation.
SHORT_RECIPE = {"trainer.max_updates": 12, "trainer.save_every": 1, "trainer.log_every": 1,
                "trainer.validate_every": 0}


def write_recipe(path: Path, output_dir: Path, base: Path = CPU_RECIPE, **changes: object
                 ) -> Path:
    """A copy of `base` writing to `output_dir`, with dotted-key changes applied."""
    data = yaml.safe_load(base.read_text())
    data["trainer"]["output_dir"] = str(output_dir)
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__") if "__" in dotted else dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
