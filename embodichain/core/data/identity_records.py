"""Per-file digests behind a source's identity, kept in the per-user cache, so that a
refused resume can name the files that changed (the identity itself is one digest).

`record_identity` stores, under the identity string's hash, the dataset's root and each
file's digest; `changed_files` compares two recorded identities. A record is written on
the machine that computed the identity and read only there: where either is missing, the
refusal names the identities alone. Nothing here is needed for correctness. No torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

from embodichain.core.data.digests import cache_dir


def _record_path(identity: str) -> Path:
    key = hashlib.sha256(identity.encode()).hexdigest()
    return cache_dir() / "identities" / key[:2] / f"{key}.json"


def record_identity(identity: str, root: str, files: Mapping[str, str]) -> None:
    """Remember `files` ({path relative to root: digest}) as what `identity` digests; a
    cache that cannot be written is skipped (the digests' own warning says so)."""
    path = _record_path(identity)
    record = {"identity": identity, "root": root, "files": dict(files)}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def recorded_files(identity: str) -> dict[str, str] | None:
    try:
        record = json.loads(_record_path(identity).read_text())
    except (OSError, ValueError):
        return None
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, dict) and record.get("identity") == identity else None


def changed_files(old: str, new: str) -> list[str] | None:
    """The files whose digest differs between two recorded identities (added and removed
    ones included), or None where either was not recorded on this machine."""
    before, after = recorded_files(old), recorded_files(new)
    if before is None or after is None:
        return None
    return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


def describe_change(old: str, new: str) -> str:
    """A sentence naming the changed files, or '' where they are not known here."""
    changed = changed_files(old, new)
    if not changed:
        return ""
    shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10
                                       else "")
    return f"changed files: {shown}"
