"""Taking back a fresh claim when the run did nothing (R-RUN-1, design §9).

A fresh run claims its output directory (run.json) before its first update. If it then fails
before any update is done and nothing was saved (an objective that raises, a batch too big
for memory), the claim would refuse the very same command next time ("already holds a
run"), though the directory holds no work. So rank 0 removes what this run itself created
there, and only that: names that were in the directory before the claim stay untouched,
run.json goes only if it is this run's, and only directories the claim created are removed
(when empty). Call it while holding the run lock: no other process writes there meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from embodichain.core.runs.run_dir import RUN_JSON


@dataclass(frozen=True)
class ClaimSite:
    """The output directory as it was before a fresh run claimed it."""

    directory: str
    existed: tuple[str, ...] | None  # names in it before the claim; None: it did not exist
    created: tuple[str, ...]  # directories the claim creates, deepest first

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClaimSite:
        existed = data.get("existed")
        return cls(str(data["directory"]), None if existed is None else tuple(existed),
                   tuple(data.get("created") or ()))


def before_claim(directory: Path) -> ClaimSite:
    """Note what exists, before the lock and the claim create anything."""
    directory = Path(directory)
    created = []
    missing = directory
    while not missing.exists() and missing != missing.parent:
        created.append(str(missing))
        missing = missing.parent
    existed = tuple(sorted(os.listdir(directory))) if directory.is_dir() else None
    return ClaimSite(str(directory), existed, tuple(created))


def take_back(site: ClaimSite, run_id: str) -> list[str]:
    """Remove what the run `run_id` created since `site` was noted; returns the names removed.

    Nothing is removed when a checkpoint was written (that is work to keep) or when run.json
    is not this run's.
    """
    directory = Path(site.directory)
    if not directory.is_dir():
        return []
    existed = set(site.existed or ())
    new = sorted(name for name in os.listdir(directory) if name not in existed)
    if any(name.endswith(".pt") for name in new) or not _is_ours(directory, run_id):
        return []
    removed = []
    for name in new:
        path = directory / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(name)
    for created in site.created:  # deepest first; stops at the first that is not empty
        try:
            os.rmdir(created)
        except OSError:
            break
    return removed


def _is_ours(directory: Path, run_id: str) -> bool:
    try:
        return json.loads((directory / RUN_JSON).read_text()).get("run_id") == run_id
    except (OSError, ValueError, AttributeError):
        return False
