"""The run directory: exclusive claim, run.json identity and metrics.jsonl (R-RUN-1..3).

Only global rank 0 touches the directory.

Torn-line policy for metrics.jsonl: a crash can leave a final line without its newline.
Readers ignore such a line (and warn); resuming in place first moves the fragment into
`metrics.torn.jsonl` and records that in run.json, so nothing is lost or silently dropped.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from embodichain.core.errors import RefusedError
from embodichain.core.runs.commands import resume_command

RUN_JSON = "run.json"
METRICS = "metrics.jsonl"
TORN_METRICS = "metrics.torn.jsonl"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def new_run_id() -> str:
    return uuid.uuid4().hex


def artifacts_in(directory: Path) -> list[str]:
    """Names that make a directory 'used': run.json, metrics.jsonl, any *.pt."""
    if not directory.is_dir():
        return []
    names = [n for n in (RUN_JSON, METRICS) if (directory / n).exists()]
    names += sorted(p.name for p in directory.glob("*.pt"))
    return names


def output_dir_problem(directory: Path) -> str | None:
    """Why a fresh run could not start in `directory` now, or None (for warnings)."""
    if directory.exists() and not directory.is_dir():
        return f"trainer.output_dir {directory} exists and is not a directory"
    found = artifacts_in(directory)
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        return (f"trainer.output_dir {directory} already holds a run ({shown}); train-sl "
                f"would refuse it (continue it with `{_continue_command(directory)}`)")
    ancestor = directory
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor != directory and not ancestor.is_dir():
        return f"trainer.output_dir {directory} cannot be created: {ancestor} is a file"
    # No write-permission check: validate-config checks a recipe, possibly on a read-only
    # checkout or for another machine; training reports an unwritable directory (exit 2).
    return None


def _continue_command(directory: Path) -> str:
    """`embodichain resume DIR`, launched as the run in `directory` was (its world size)."""
    try:
        world_size = (read_run_json(directory) or {}).get("world_size")
    except RefusedError:  # an unreadable run.json: the plain command
        world_size = None
    return resume_command(directory, world_size if isinstance(world_size, int) else None)


def unusable_output_dir(directory: Path, exc: OSError, *internal: Path) -> RefusedError:
    """A directory that cannot be created or written is bad input (exit 2), not a training
    failure: the error names the key and the reason, never one of our temp files."""
    hidden = {None, str(directory), *map(str, internal)}
    where = f" ({exc.filename})" if exc.filename not in hidden else ""
    return RefusedError(f"trainer.output_dir {directory} cannot be used: "
                        f"{exc.strerror or exc}{where}; nothing was changed")


def require_fresh(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise RefusedError(f"trainer.output_dir {directory} exists and is not a directory")
    found = artifacts_in(directory)
    if found:
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise RefusedError(
            f"trainer.output_dir {directory} already holds a run ({shown}); a fresh run needs "
            f"an artifact-free directory. Choose another one, e.g. "
            f"--set trainer.output_dir={directory}_2, or continue that run with "
            f"`{_continue_command(directory)}`. Nothing was changed."
        )


# `.NAME.PID[.HEX].tmp`: what an atomic write of a checkpoint, run.json or metrics.jsonl
# leaves behind when killed. Never `*.pt`, so never mistaken for a snapshot.
_TEMP_FILE = re.compile(r"^\.[\w.-]+\.(pt|json|jsonl)\.\d+(\.[0-9a-f]+)?\.tmp$")


def remove_stale_temp_files(directory: Path) -> list[str]:
    """Delete temporary files that killed writes left; call only while holding the run lock
    (no live writer can own them then). Returns the names removed."""
    removed = []
    for path in directory.iterdir():
        if _TEMP_FILE.match(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return sorted(removed)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def claim(directory: Path, identity: dict[str, Any]) -> None:
    """Create `run.json` exclusively: of two launches racing for a directory, one wins.

    The complete file is written under a temporary name and hard-linked into place; a link
    never replaces an existing name, so the claim is atomic and run.json is never partial.
    """
    require_fresh(directory)
    tmp = directory / f".{RUN_JSON}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(identity, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, directory / RUN_JSON)
        except FileExistsError:
            raise RefusedError(
                f"trainer.output_dir {directory} was claimed by another run at the same time "
                "(run.json appeared); nothing was changed"
            ) from None
    except OSError as exc:
        raise unusable_output_dir(directory, exc, tmp) from None
    finally:
        if tmp.exists():  # not `missing_ok`: under a file, unlink fails with ENOTDIR
            tmp.unlink()


def read_run_json(directory: Path) -> dict[str, Any] | None:
    path = directory / RUN_JSON
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RefusedError(f"{path} is unreadable ({exc}); it cannot be resumed in place") \
            from None


def planned_updates(run_json: dict[str, Any]) -> int | None:
    """The run's `trainer.max_updates` now: the newest resume's (`--set
    trainer.max_updates=N` raises it), else the recipe's that started the run."""
    for event in reversed(run_json.get("events") or []):
        if isinstance(event, dict) and event.get("event") == "resumed" \
                and isinstance(event.get("max_updates"), int):
            return event["max_updates"]
    trainer = (run_json.get("config") or {}).get("trainer") or {}
    value = trainer.get("max_updates")
    return value if isinstance(value, int) else None


def update_run_json(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = read_run_json(directory) or {}
    change(data)
    write_json_atomic(directory / RUN_JSON, data)


@dataclass
class MetricsLog:
    """What metrics.jsonl holds: complete records, plus a torn last line if any."""

    records: list[dict[str, Any]] = field(default_factory=list)
    torn: str | None = None
    bad_lines: list[int] = field(default_factory=list)

    @property
    def last_step(self) -> int | None:
        steps = [r["step"] for r in self.records if isinstance(r.get("step"), int)]
        return max(steps) if steps else None


def read_metrics(path: Path) -> MetricsLog:
    """Read metrics.jsonl without ever failing on a damaged line."""
    log = MetricsLog()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return log
    complete, _, tail = data.rpartition(b"\n")
    if tail:
        log.torn = tail.decode("utf-8", "replace")
    lines = complete.split(b"\n") if complete else []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # bad JSON, bad UTF-8, absurd nesting
            log.bad_lines.append(number)
            continue
        if isinstance(record, dict):
            log.records.append(record)
        else:
            log.bad_lines.append(number)
    return log


def move_torn_tail(directory: Path) -> str | None:
    """Cut a torn final line off metrics.jsonl into metrics.torn.jsonl; returns the fragment."""
    path = directory / METRICS
    if not path.exists():
        return None
    data = path.read_bytes()
    complete, newline, tail = data.rpartition(b"\n")
    if not tail:
        return None
    with open(directory / TORN_METRICS, "ab") as side:
        side.write(tail + b"\n")
        side.flush()
        os.fsync(side.fileno())
    with open(path, "r+b") as f:
        f.truncate(len(complete) + len(newline))
        f.flush()
        os.fsync(f.fileno())
    return tail.decode("utf-8", "replace")


def finite_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without non-finite numbers: metrics.jsonl is strict JSON (no NaN/Infinity)."""
    return {k: v for k, v in values.items()
            if not (isinstance(v, float) and not math.isfinite(v))}


class MetricsWriter:
    """Appends one JSON object per line, flushed as written, fsynced on `sync()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a")  # noqa: SIM115 - lives as long as the run

    def write(self, record: dict[str, Any]) -> None:
        # allow_nan=False: strict JSON, so a NaN that slipped through is an error, not a line
        # that strict parsers reject (the trainer leaves non-finite values out).
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()

    def write_many(self, records: Iterable[dict[str, Any]]) -> None:
        for record in records:
            self.write(record)

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def fsync(self) -> None:
        """Make durable what `write` has flushed; safe from another thread (the background
        checkpoint writer), which must never touch the file object's buffer."""
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()
