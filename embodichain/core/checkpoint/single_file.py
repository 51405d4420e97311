"""The checkpoint format interface and its base case, one file (`SingleFile`: DDP writes
everything into it, nothing beside it); the sharded format builds on it
(core/checkpoint/shard_format.py) and core/checkpoint/formats.py tells them apart.
Torch-free at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from embodichain.core.errors import UsageError


class NoEmaWeights(UsageError):
    """The checkpoint holds no EMA weights (its caller says how to do without them)."""


class SingleFile:
    """Everything in the one file: no parts, nothing to judge beyond the file's digest."""

    written_by = "ddp"  # the strategy writing this format (reports name it)
    keeps_parts = False  # whether parts are files beside the checkpoint's own

    def rank_entries(self, data: Mapping[str, Any]) -> Any:
        """The per-rank table a restore needs one entry of per rank (None: there is none)."""
        return data["payload"].get("ranks")

    def parts(self, data: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        """The parts kept beside the file, by part number (an old rank): file, host, node."""
        return {}

    def parts_seen(self, data: Mapping[str, Any], path: Path) -> list[int]:
        """The parts whose file this node sees at the checkpoint's side."""
        return []

    def problems_here(self, data: Mapping[str, Any], path: Path) -> list[str]:
        """What is wrong with the parts this node can judge ([]: none)."""
        return []

    def parts_elsewhere(self, data: Mapping[str, Any], path: Path) -> list[int]:
        """The parts this node cannot judge: written on another node and absent here."""
        return []

    def check_part(self, directory: Path, data: Mapping[str, Any], part: int) -> str | None:
        """None when part `part` (at `directory`) verifies, else what is wrong (one line)."""
        return None

    def payload_to_restore(self, data: Mapping[str, Any], path: Path) -> dict[str, Any]:
        """A verified checkpoint's payload, as the strategy restores from it."""
        return dict(data["payload"])

    def describe_part(self, data: Mapping[str, Any], path: Path, part: int) -> str:
        """A part named for a message: its file and where it was written."""
        return f"part {part} of {path}"

    def unreachable(self, data: Mapping[str, Any], path: Path, part: int,
                    nodes: list[list[Any]]) -> str:
        """Why no node of this world (`nodes`: host and node rank each) can give part `part`:
        missing on the node that wrote it, or written on a node outside this world."""
        return f"{self.describe_part(data, path, part)} is on no node of this world"

    def read_part(self, directory: Path, data: Mapping[str, Any], part: int
                  ) -> dict[str, Any]:
        """Part `part`'s own verified payload (a shard's state); one file keeps no parts."""
        raise KeyError(f"a single-file checkpoint keeps no part {part}")

    def parts_view(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """The little of a checkpoint's data that the questions about its parts read (what
        rank 0 sends every rank when it asks which parts they hold): no tensors."""
        return {"payload": {}}

    def whole_model(self, data: Mapping[str, Any], path: Path, *, ema: bool = False
                    ) -> dict[str, Any]:
        """The whole model's (or its EMA's) state_dict in the verified checkpoint `data` at
        `path` (export, a policy's weights): here, the file's own (`payload.learner.model`,
        or its `ema`: a state_dict, or a mapping holding one under `model`)."""
        import torch

        learner = data["payload"]["learner"]
        if not ema:
            return dict(learner["model"])
        found = learner.get("ema")
        if found is None:
            raise NoEmaWeights(f"{path} holds no EMA weights (the run had no trainer.ema "
                               "when it wrote this checkpoint)")
        if isinstance(found, Mapping) and isinstance(found.get("model"), Mapping):
            found = found["model"]
        if not (isinstance(found, Mapping)
                and all(isinstance(v, torch.Tensor) for v in found.values())):
            raise UsageError(f"{path}: its EMA entry is not a state_dict of tensors; this "
                             "embodichain cannot export it")
        return dict(found)


SINGLE_FILE = SingleFile()
