"""The sharded checkpoint format as resume-time checks and offline readers ask it (the
`CheckpointFormat` of `trainer.strategy: fsdp`, core/checkpoint/single_file.py): a manifest and
one shard file per rank, possibly on other nodes. Torch-free at import, like the interface;
the shard files themselves are read and written by core/checkpoint/sharded.py (torch),
imported where a method needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from embodichain.core.checkpoint.single_file import SingleFile


class Sharded(SingleFile):
    """A manifest and one shard file per old rank (`trainer.strategy: fsdp`)."""

    written_by = "fsdp"
    keeps_parts = True

    def holds(self, data: Mapping[str, Any]) -> bool:
        """Whether the verified checkpoint dict `data` is a manifest of this format."""
        return isinstance(data.get("payload"), Mapping) and "sharded" in data["payload"]

    def rank_entries(self, data: Mapping[str, Any]) -> Any:
        table = data["payload"].get("sharded")  # one shard file per rank
        return table.get("shards") if isinstance(table, Mapping) else None

    def parts(self, data: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
        return _sharded().shard_table(data) if self.holds(data) else {}

    def parts_seen(self, data: Mapping[str, Any], path: Path) -> list[int]:
        return sorted(k for k, e in self.parts(data).items()
                      if (Path(path).parent / e["file"]).is_file())

    def problems_here(self, data: Mapping[str, Any], path: Path) -> list[str]:
        return _sharded().shard_problems_here(data, path)

    def parts_elsewhere(self, data: Mapping[str, Any], path: Path) -> list[int]:
        return _sharded().shards_elsewhere(data, path)

    def check_part(self, directory: Path, data: Mapping[str, Any], part: int) -> str | None:
        return _sharded().check_shard(directory, data, part)

    def payload_to_restore(self, data: Mapping[str, Any], path: Path) -> dict[str, Any]:
        return _sharded().payload_to_restore(data, path)

    def read_part(self, directory: Path, data: Mapping[str, Any], part: int
                  ) -> dict[str, Any]:
        return _sharded().read_shard(directory, data, part)["payload"]

    def describe_part(self, data: Mapping[str, Any], path: Path, part: int) -> str:
        entry = self.parts(data).get(part, {})
        return (f"the shard of rank {part} ({Path(path).parent / entry.get('file', '?')}, "
                f"written on host {entry.get('host')}, node {entry.get('node', 0)})")

    def parts_view(self, data: Mapping[str, Any]) -> dict[str, Any]:
        payload = data["payload"]
        return {"payload": {"run": payload["run"], "sharded": payload["sharded"]}}

    def whole_model(self, data: Mapping[str, Any], path: Path, *, ema: bool = False
                    ) -> dict[str, Any]:
        return _sharded().consolidated_model(path, data, ema=ema)  # each shard verified

    def unreachable(self, data: Mapping[str, Any], path: Path, part: int,
                    nodes: list[list[Any]]) -> str:
        entry = self.parts(data).get(part, {})
        file, host = Path(path).parent / entry.get("file", "?"), entry.get("host")
        if [host, entry.get("node", 0)] in [list(n) for n in nodes]:
            return f"shard of rank {part} is missing: {file} (written on host {host})"
        shown = ", ".join(f"{h} node {n}" for h, n in nodes)
        return (f"shard of rank {part} ({file}, written on host {host}, node "
                f"{entry.get('node', 0)}) is not reachable from any node of this world "
                f"({shown}): put it at that path on one of them (or on a shared filesystem)")


SHARDED = Sharded()


def _sharded() -> ModuleType:
    from embodichain.core.checkpoint import sharded  # torch

    return sharded
