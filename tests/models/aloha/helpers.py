"""The ALOHA tests' tiny recipe: the transfer-cube example shrunk to a few updates of a
small model on a 2-episode dataset, judged on 2 short closed-loop episodes."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.support.processes import REPO

EXAMPLE = REPO / "examples" / "learning" / "aloha" / "transfer_cube.yaml"
UPDATES = 6


def tiny_recipe(path: Path, data: Path, output_dir: Path, **changes: object) -> Path:
    """The example recipe, shrunk; `changes` as dotted keys (`data.task="insertion"`)."""
    recipe = yaml.safe_load(EXAMPLE.read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update({"batch_size": 4, "global_batch_size": 8, "max_updates": UPDATES,
                              "save_every": 3, "validate_every": UPDATES, "log_every": 1,
                              "output_dir": str(output_dir)})
    recipe["scheduler"]["warmup_updates"] = 2
    recipe["model"].update({"hidden": 32, "heads": 4, "feedforward": 64})
    recipe["data"].update({"root": str(data), "chunk": 10})
    recipe["evaluation"].update({"episodes": 2, "max_steps": 25, "envs_per_rank": 1})
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = recipe
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path
