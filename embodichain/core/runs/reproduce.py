"""`embodichain reproduce RUN_DIR`: what to train again, and how the history compares
(R-TRUST-5). Torch-free: the snapshots' tensors are compared in `snapshot_compare`, the
training itself runs in `core/launch/reproduce`.

The reproduction trains the recipe run.json stores, from scratch, in a new directory, on
the run's world size, and is then compared with the original record by record (every
metric of metrics.jsonl but those the machine measured: `NOT_REPRODUCIBLE_PREFIXES`) and snapshot
by snapshot. The recorded environments are compared too (versions, platform, device, the
data's identity): where the histories differ, they are the usual cause.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.manifest import read_manifest
from embodichain.core.checkpoint.names import LAST, step_files
from embodichain.core.errors import RefusedError, UsageError
from embodichain.core.runs.elastic import without_derived_keys
from embodichain.core.runs.measured import MEASURED_PREFIXES, is_measured
from embodichain.core.runs.run_dir import (
    METRICS,
    RUN_JSON,
    planned_updates,
    read_metrics,
    read_run_json,
)

# Metrics that no two runs share, bitwise identical or not: what the machine measured, a
# clock under `time/` (time/updates_per_s, time/elapsed_s, time/examples_per_s,
# time/data_wait, time/data_wait_max, time/validation_s, time/evaluation_s, time/split/...)
# and the memory under `memory/` (memory/peak, memory/peak_rank_R). Every other key of every
# record is compared exactly.
NOT_REPRODUCIBLE_PREFIXES = MEASURED_PREFIXES


def reproducible(record: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics record without the keys the machine measured (a clock, the memory)."""
    return {k: v for k, v in record.items() if not is_measured(k)}


@dataclass(frozen=True)
class Plan:
    """What `reproduce` trains: the stored recipe (`config`, from scratch, into `output`)
    on `world_size` workers up to update `through`, and compares through it."""

    run_dir: Path
    output: Path
    world_size: int
    through: int
    config: dict[str, Any]
    source: str
    notes: tuple[str, ...] = ()


def default_output(run_dir: Path) -> Path:
    """`RUN_DIR-reproduce-N`, the first N for which nothing exists yet."""
    if run_dir.name in ("", ".."):  # `reproduce .`: named after the directory itself
        run_dir = run_dir.resolve()
    n = 1
    while (candidate := run_dir.with_name(f"{run_dir.name}-reproduce-{n}")).exists():
        n += 1
    return candidate


def plan(run_dir: Path, output: Path | None, until: int | None, *, check_output: bool = True
         ) -> Plan:
    """The reproduction of `run_dir`, or UsageError (exit 2) naming what is wrong: no run
    there, an output that exists (unless not `check_output`: the launched workers, whose
    rank 0 claims it), an `until` beyond what the original recorded."""
    if not run_dir.is_dir():
        raise RefusedError(f"{run_dir} is not a run directory"
                           + (" (it is a file)" if run_dir.exists() else " (no such directory)"))
    record = read_run_json(run_dir)
    if record is None or not isinstance(record.get("config"), dict):
        raise RefusedError(f"{run_dir} holds no {RUN_JSON} with a recipe: it is not a run "
                           "that can be reproduced")
    world_size = started_on(record)
    if not isinstance(world_size, int) or world_size < 1:
        raise RefusedError(f"{run_dir / RUN_JSON} records no world size ({world_size!r})")
    output = output if output is not None else default_output(run_dir)
    if check_output and output.exists():
        raise RefusedError(f"--output {output} exists: the reproduction trains into a new "
                           "directory and never writes into one that exists. Name another "
                           "one. Nothing was changed.")
    recorded = recorded_updates(run_dir)
    if not recorded:
        raise RefusedError(f"{run_dir} recorded no update (no metrics and no snapshot): "
                           "there is nothing to compare with")
    reached = max(recorded)
    if until is not None and until < 1:
        raise UsageError(f"--until: expected a positive update, got {until}")
    if until is not None and until > reached:
        raise RefusedError(f"--until {until}: the run in {run_dir} reached update {reached} "
                           f"only; give --until {reached} or less")
    if until is not None and until < min(recorded):
        raise RefusedError(f"--until {until}: the run in {run_dir} logged no metrics and "
                           f"saved no snapshot up to that update (the first at update "
                           f"{min(recorded)}): there would be nothing to compare")
    config = without_derived_keys(record["config"])
    config["trainer"] = {**config["trainer"], "output_dir": str(output),
                         "max_updates": planned_updates(record) or reached}
    return Plan(run_dir, output, world_size, until or reached, config,
                f"{run_dir / RUN_JSON} (stored recipe)", tuple(history_notes(record)))


def started_on(record: Mapping[str, Any]) -> Any:
    """The world size the run started on (run.json's `world_size` is the latest: a run
    continued on another number of workers records each change)."""
    changes = record.get("world_size_changes")
    if isinstance(changes, list) and changes and isinstance(changes[0], Mapping):
        return changes[0].get("from")
    return record.get("world_size")


def recorded_updates(run_dir: Path) -> set[int]:
    """The updates the original logged metrics or saved a snapshot at."""
    steps = {r["step"] for r in read_metrics(run_dir / METRICS).records
             if isinstance(r.get("step"), int)}
    return steps | set(snapshot_steps(run_dir))


def snapshot_steps(run_dir: Path) -> dict[int, Path]:
    """Each snapshot of a run by its update: the step files, and last.pt where no step file
    holds its update (manifests only: no torch)."""
    found = dict(step_files(run_dir))
    manifest = read_manifest(run_dir / LAST) if (run_dir / LAST).is_file() else None
    if manifest is not None and isinstance(manifest.get("step"), int):
        found.setdefault(int(manifest["step"]), run_dir / LAST)
    return found


def history_notes(record: Mapping[str, Any]) -> list[str]:
    """What in the original's history a run from scratch does not repeat: a resume that
    changed the recipe's length or world size (a schedule spanning `trainer.max_updates`
    then changed at that update)."""
    notes = []
    now = (record.get("config") or {}).get("trainer", {}).get("max_updates")
    final = planned_updates(record)
    for event in record.get("events") or []:
        if not isinstance(event, Mapping) or event.get("event") != "resumed":
            continue
        if isinstance(event.get("max_updates"), int) and event["max_updates"] != now:
            notes.append(f"the original was resumed at update {event.get('step')} with "
                         f"trainer.max_updates {event['max_updates']} (until then "
                         f"{now}); the reproduction trains with {final} throughout")
            now = event["max_updates"]
    for change in record.get("world_size_changes") or []:
        if isinstance(change, Mapping):
            notes.append(f"the original continued at update {change.get('at_update')} on "
                         f"{change.get('to')} workers (from {change.get('from')}); the "
                         "reproduction runs on the world size it started on throughout")
    return notes


# -- metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """The first thing that differs: at `update`, `what` (a metric, a tensor, a record)."""

    update: int
    what: str
    detail: str

    def sentence(self) -> str:
        return f"first difference at update {self.update}: {self.what}: {self.detail}"


@dataclass(frozen=True)
class MetricsCompared:
    records: int
    difference: Difference | None
    last_step: int = 0  # the last update whose records were compared


def compare_metrics(original: Path, reproduction: Path, through: int) -> MetricsCompared:
    """metrics.jsonl of both runs through update `through`, record by record, every key
    but the not reproducible ones, exactly (floats bitwise: no tolerance)."""
    def records(directory: Path) -> list[dict[str, Any]]:
        log = read_metrics(directory / METRICS)
        return [reproducible(r) for r in log.records
                if isinstance(r.get("step"), int) and r["step"] <= through]

    mine, theirs = records(original), records(reproduction)
    for a, b in zip(mine, theirs, strict=False):
        if a == b and all(_same_bits(a[k], b[k]) for k in a):
            continue
        step = min(a["step"], b["step"])
        if a["step"] != b["step"]:
            return MetricsCompared(0, Difference(step, "records", _missing(a, b)))
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in a or key not in b:
                side = "the reproduction" if key not in b else "the original"
                return MetricsCompared(0, Difference(step, f"metric {key}",
                                                     f"absent in {side}'s record"))
            if not _same_bits(a[key], b[key]):
                return MetricsCompared(0, Difference(
                    step, f"metric {key}", f"original {a[key]!r}, reproduction {b[key]!r}"))
    if len(mine) != len(theirs):
        longer, name = (mine, "original") if len(mine) > len(theirs) else (theirs,
                                                                           "reproduction")
        extra = longer[min(len(mine), len(theirs))]
        return MetricsCompared(0, Difference(extra["step"], "records",
                                             f"only the {name} logged a record at update "
                                             f"{extra['step']} ({', '.join(list(extra)[:4])})"))
    return MetricsCompared(len(mine), None, max((r["step"] for r in mine), default=0))


def _same_bits(a: Any, b: Any) -> bool:
    """Equal, and the same float bits (0.0 and -0.0 differ; NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return a.hex() == b.hex() or (math.isnan(a) and math.isnan(b))
    return type(a) is type(b) and a == b


def _missing(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    if a["step"] < b["step"]:
        return f"the original logged a record at update {a['step']} that the reproduction did not"
    return f"the reproduction logged a record at update {b['step']} that the original did not"


# -- the recorded environment ------------------------------------------------------------------


def environment_differences(original: Mapping[str, Any], reproduction: Mapping[str, Any]
                            ) -> list[str]:
    """What differs between the environments two run.json files record: each package
    version, the platform and device, the data's identity (with the files that changed,
    where this machine recorded both identities)."""
    found = []
    for section in ("versions", "environment"):
        before, now = original.get(section), reproduction.get(section) or {}
        if not isinstance(before, Mapping):
            found.append(f"the original recorded no {section} (now: "
                         + ", ".join(f"{k} {v}" for k, v in now.items()) + ")")
            continue
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                found.append(f"{key}: {before.get(key, 'absent')} in the original, "
                             f"{now.get(key, 'absent')} now")
    old, new = original.get("source_identity"), reproduction.get("source_identity")
    if old != new:
        from embodichain.core.data.identity_records import describe_change

        change = describe_change(str(old), str(new))
        found.append(f"dataset identity: {old} in the original, {new} now"
                     + (f" ({change})" if change else ""))
    return found


def environment_summary(run: Mapping[str, Any]) -> str:
    """`python 3.11.7, torch 2.13.0, ..., platform Linux-..., device cpu, dataset sha256:...`."""
    values = {**(run.get("versions") or {}), **(run.get("environment") or {}),
              "dataset": run.get("source_identity")}
    return ", ".join(f"{k} {v}" for k, v in values.items())
