"""Where a run starts and what it may continue from (R-RESUME-2..9, R-RUN-1, R-RUN-5).

Four ways to start, all decided on global rank 0 before any training:

- fresh: an artifact-free output_dir, claimed exclusively;
- a checkpoint file (`--resume CKPT`): into a fresh output_dir, or into the checkpoint's own
  run directory when its history is not ahead of the checkpoint (R-RESUME-4);
- in place (`resume RUN_DIR`): from the run's newest complete snapshot; history beyond it is
  rolled back (moved to a side file, never deleted) so that no two histories mix;
- auto (`--resume auto`): fresh when output_dir holds no run, in place when it holds a run of
  the same recipe, world size and data, refused otherwise. This is what `torchrun
  --max-restarts` and a requeued batch job rerun.

A live run's directory is locked (run_lock), so none of this ever races a running writer.
A run that already reached `trainer.max_updates` is complete: nothing is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.checkpoint.formats import CheckpointFormat, check_rank_entries, format_of
from embodichain.core.checkpoint.manifest import checkpoint_step
from embodichain.core.checkpoint.names import LAST, step_files
from embodichain.core.errors import CheckpointError, RefusedError
from embodichain.core.recipe.best import stopped_early
from embodichain.core.runs.commands import command_for, fresh_command, resume_command
from embodichain.core.runs.config_compat import config_differences, keys_at_default, moved
from embodichain.core.runs.elastic import continues_on_any_world_size, world_size_change
from embodichain.core.runs.fresh_claim import ClaimSite, before_claim
from embodichain.core.runs.resume_record import (
    Commit,
    Committed,
    InPlaceRecord,
    added_note,
    moved_note,
)
from embodichain.core.runs.run_dir import (
    METRICS,
    RUN_JSON,
    artifacts_in,
    claim,
    read_metrics,
    read_run_json,
    require_fresh,
)
from embodichain.core.runs.run_end import RUN_JSON_FORMAT
from embodichain.core.runs.run_lock import (
    RunLock,
    describe_holder,
    last_holder,
    refuse_if_locked,
)
from embodichain.core.runs.snapshots import (
    PartChecks,
    PartsProblems,
    Snapshot,
    newest_snapshot,
    snapshot_files,
)

StartKind = Literal["fresh", "checkpoint", "in_place", "auto"]


@dataclass(frozen=True)
class Start:
    """How a run begins. `checkpoint` for kind "checkpoint"; for "in_place", the snapshot the
    caller chose (None: the run never saved one, so it restarts from update 0)."""

    kind: StartKind = "fresh"
    checkpoint: Path | None = None
    snapshot: Snapshot | None = None


@dataclass
class Prepared:
    """What rank 0 decided: the run's identity and the payload to restore (None: from 0).
    `commit` writes what a resume records (roll-back, events, world size, added keys, a
    fresh destination's claim): the start-up runs it only once every rank has loaded its
    state (R-PREEMPT-2); until then nothing in the directory has changed."""

    identity: dict[str, Any]
    payload: dict[str, Any] | None = None
    continued: bool = False  # resumed (from a snapshot, or an earlier run restarted at 0)
    notes: tuple[str, ...] = ()
    claimed: ClaimSite | None = None  # a fresh claim: what the directory held before it
    commit: Commit | None = None
    snapshot: Path | None = None  # the checkpoint the payload was read from


class RunComplete(Exception):
    """The run already reached trainer.max_updates; nothing to do (exit 0)."""


# ----------------------------------------------------------------------------------------
# Compatibility (R-RESUME-2)


def resume_problems(snapshot: Mapping[str, Any], resolved: Mapping[str, Any],
                    identity: Mapping[str, Any], again: str | None = None,
                    schema: type[BaseModel] | None = None) -> list[str]:
    """Each field that forbids resuming `snapshot` (a checkpoint's or run.json's run
    section) as this run, with both values. `again`: the command's arguments (`resume
    DIR`), so that a world-size mismatch names the launch that fits; `schema`: the recipe's
    (config_compat.config_differences)."""
    problems = []
    saved_size = snapshot.get("world_size")
    differences = config_differences(snapshot.get("config") or {}, resolved,
                                     int(snapshot.get("step") or 0), schema,
                                     same_source=snapshot.get("source_identity")
                                     == identity["source_identity"])
    if saved_size != identity["world_size"] and not continues_on_any_world_size(
            snapshot.get("config") or {}, resolved):
        # A command that keeps this run's other differences would be refused in turn.
        other = differences or snapshot.get("source_identity") != identity["source_identity"]
        launch = (_launch_that_fits(saved_size, again) if not other else
                  f"launch {saved_size} worker(s) once the differences below are undone")
        problems.append(f"world_size: checkpoint {saved_size}, this run "
                        f"{identity['world_size']} (exact recovery needs the same number of "
                        f"workers: {launch}; a run with "
                        "trainer.global_batch_size may continue on another number; or start "
                        "a new run from its weights with train-sl --init-from CHECKPOINT)")
    if snapshot.get("source_identity") != identity["source_identity"]:
        from embodichain.core.data.identity_records import describe_change

        change = describe_change(str(snapshot.get("source_identity")),
                                 str(identity["source_identity"]))
        problems.append(f"source identity: checkpoint {snapshot.get('source_identity')}, "
                        f"this run {identity['source_identity']}"
                        + (f" ({change})" if change else ""))
    return problems + differences


def _launch_that_fits(world_size: Any, again: str | None) -> str:
    """How to start `world_size` workers: the whole command when it is known."""
    if not isinstance(world_size, int):
        return "launch as the run was launched"
    if again is not None:
        return f"launch with {command_for(again, world_size)}"
    if world_size <= 1:
        return "launch one process, without torchrun"
    return (f"launch with torchrun --nproc-per-node={world_size} or with --nproc-per-node "
            f"{world_size}")


def _refuse_differences(what: str, problems: list[str]) -> None:
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise RefusedError(f"cannot resume from {what}: it differs from this run in\n{listed}"
                           "\nNothing was changed.")


# ----------------------------------------------------------------------------------------
# Deciding on rank 0


def prepare(start: Start, identity: dict[str, Any], directory: Path, lock: RunLock,
            recipe_source: str | None = None, schema: type[BaseModel] | None = None,
            checkpoint_format: CheckpointFormat | None = None,
            elsewhere: PartsProblems | None = None) -> Prepared:
    """Decide how the run starts, lock and claim or continue its directory (rank 0 only).

    `identity` is this launch's identity (a new run id, config, source identity...);
    `schema` the recipe's schema, whose defaults decide keys newer than a checkpoint
    (None: the framework's alone). Raises RefusedError (exit 2) or RunComplete; on success
    the directory is locked by `lock`. A resume writes nothing here: its `commit` does,
    once every rank has loaded. `checkpoint_format` is the strategy's (what its checkpoints
    keep beside their file; None: as each file says); `elsewhere` asks the nodes of this
    world about the parts this node does not hold, so that a snapshot counts as complete
    (or a named checkpoint is refused) before anything changes.
    """
    resolved = identity["config"]
    max_updates = int(resolved["trainer"]["max_updates"])
    site = _Site(checkpoint_format, elsewhere)
    if start.kind == "fresh":
        return _fresh(identity, directory, lock)
    if start.kind == "checkpoint":
        assert start.checkpoint is not None
        return _from_checkpoint(start.checkpoint, identity, directory, lock, recipe_source,
                                schema, site)
    if start.kind == "in_place":
        return _in_place(identity, directory, lock, max_updates, chosen=start.snapshot,
                         again=f"resume {directory}", schema=schema, site=site)
    # auto
    run_json = read_run_json(directory) if directory.is_dir() else None
    if run_json is None:
        if artifacts_in(directory):
            require_fresh(directory)  # refuses, naming what is there
        return _fresh(identity, directory, lock)
    return _in_place(identity, directory, lock, max_updates,
                     again=f"train-sl --config {recipe_source or 'RECIPE.yaml'} --resume auto",
                     schema=schema, site=site)


@dataclass(frozen=True)
class _Site:
    """The checkpoint format a resume reads (the strategy's) and who judges its parts."""

    checkpoint_format: CheckpointFormat | None = None
    elsewhere: PartsProblems | None = None

    def format(self, data: Mapping[str, Any]) -> CheckpointFormat:
        return self.checkpoint_format or format_of(data)

    @property
    def parts(self) -> PartChecks:
        return PartChecks(lambda path, data: self.format(data).problems_here(data, path),
                          self.elsewhere)

    def payload(self, snapshot: Snapshot) -> dict[str, Any]:
        return self.format(snapshot.data).payload_to_restore(snapshot.data, snapshot.path)


def _fresh(identity: dict[str, Any], directory: Path, lock: RunLock) -> Prepared:
    if directory.is_dir():
        refuse_if_locked(directory)
    require_fresh(directory)  # read-only: a refused start creates nothing, not even a lock
    site = before_claim(directory)
    lock.acquire()
    claim(directory, {**identity, "format_version": RUN_JSON_FORMAT, "events": []})
    return Prepared(identity, claimed=site)


def _from_checkpoint(checkpoint: Path, identity: dict[str, Any], directory: Path,
                     lock: RunLock, recipe_source: str | None,
                     schema: type[BaseModel] | None, site: _Site) -> Prepared:
    if checkpoint.is_dir():  # a run directory: its newest snapshot
        newest = newest_snapshot(checkpoint, parts=site.parts)
        if newest is None:
            raise RefusedError(f"--resume {checkpoint}: the run directory holds no snapshot")
        checkpoint, data = newest.path, newest.data
    else:
        data = read_checkpoint(checkpoint)
        problems = site.parts.problems(checkpoint, data)  # a named one is never replaced
        if problems:
            raise CheckpointError(f"cannot resume from the sharded checkpoint {checkpoint}: "
                                  + "; ".join(problems) + ". Nothing was changed.")
    check_rank_entries(data, checkpoint)
    snapshot = Snapshot(checkpoint, data)
    again = f"train-sl --config {recipe_source or 'RECIPE.yaml'} --resume {checkpoint}"
    _refuse_differences(str(checkpoint), resume_problems(snapshot.run, identity["config"],
                                                         identity, again, schema))
    if directory.is_dir() and directory.resolve() == checkpoint.parent.resolve():
        lock.acquire()
        _check_history_not_ahead(snapshot, directory, identity, recipe_source)
        _refuse_if_complete(snapshot, directory,
                            int(identity["config"]["trainer"]["max_updates"]), identity["config"])
        return _continue(snapshot, identity, directory, schema=schema, site=site)
    identity = {**identity, "resumed_from": {"run_id": snapshot.run.get("run_id"),
                                             "checkpoint": str(checkpoint),
                                             "step": snapshot.step}}
    change = world_size_change(snapshot.run.get("world_size"), identity["world_size"],
                               snapshot.step)
    if change is not None:
        identity["world_size_changes"] = [change]
    if directory.is_dir():
        refuse_if_locked(directory)
    require_fresh(directory)  # read-only; the claim waits until every rank has loaded

    def commit() -> Committed:
        return Committed(claimed=_fresh(identity, directory, lock).claimed)

    return Prepared(identity, site.payload(snapshot), continued=True,
                    notes=tuple(_upgrade_notes(snapshot.run.get("config") or {}, identity,
                                               schema)), commit=commit, snapshot=checkpoint)


def _upgrade_notes(saved: Mapping[str, Any], identity: Mapping[str, Any],
                   schema: type[BaseModel] | None) -> list[str]:
    """What a resume from a checkpoint with recipe `saved` shows of what is the same but
    spelled differently now (R-PREEMPT-3): keys added at their defaults, data moved."""
    notes = []
    added = keys_at_default(saved, identity["config"], schema)
    if added:
        notes.append(added_note(added))
    moves = moved(saved, identity["config"], schema)
    if moves:
        notes.append(moved_note(moves))
    return notes


def _check_history_not_ahead(snapshot: Snapshot, directory: Path, identity: dict[str, Any],
                             recipe_source: str | None) -> None:
    """R-RESUME-4: `--resume CKPT` into its own directory never rolls anything back."""
    problem = in_place_problem(snapshot.path, snapshot.run.get("run_id"), snapshot.step,
                               directory)
    if problem is None:
        return
    config_path = (recipe_source if recipe_source and Path(recipe_source).is_file()
                   else None)
    ways = (f"To continue this run from its newest snapshot, rolling back what came after "
            f"it: {resume_command(directory, identity['world_size'])}. To keep this directory "
            f"as it is, resume into a fresh one: "
            f"{fresh_command(snapshot.path, directory, config_path, identity['world_size'])}")
    raise RefusedError(f"{problem}. {ways}")


def in_place_problem(checkpoint: Path, run_id: str | None, step: int, directory: Path
                     ) -> str | None:
    """Why the checkpoint (of run `run_id`, at update `step`) may not continue its own run
    directory in place (R-RESUME-4, R-RESUME-5), or None. The one rule behind both
    `train-sl --resume CKPT` and `inspect-checkpoint CKPT --config`."""
    if run_id is None:
        return (f"{checkpoint} carries no run identity, so it cannot continue {directory} "
                "in place")
    run_json = read_run_json(directory)
    if run_json is None or run_json.get("run_id") != run_id:
        found = run_json.get("run_id") if run_json else f"no {RUN_JSON}"
        return f"{checkpoint} belongs to run {run_id}, but {directory} holds run {found}"
    history = read_metrics(directory / METRICS)
    if history.last_step is not None and history.last_step > step:
        return (f"{directory}/{METRICS} already has records up to update {history.last_step}, "
                f"beyond the checkpoint's update {step}; continuing from it here would mix "
                "two histories")
    later = [path.name for n, path in step_files(directory) if n > step]
    last_step = checkpoint_step(directory / LAST) if (directory / LAST).exists() else None
    if not later and last_step is not None and last_step > step:  # e.g. a stop's snapshot
        later = [f"{LAST} (update {last_step})"]
    if later:
        return (f"{directory} already holds checkpoints beyond update {step} "
                f"({', '.join(later[:3])}{', ...' if len(later) > 3 else ''}); continuing "
                "from it here would replace them")
    return None


def _in_place(identity: dict[str, Any], directory: Path, lock: RunLock, max_updates: int,
              chosen: Snapshot | None = None, again: str | None = None,
              schema: type[BaseModel] | None = None, site: _Site = _Site()) -> Prepared:
    """Continue the run in `directory` from its newest snapshot, rolling back what came after
    it, when this launch matches it (recipe, world size, data). `chosen` is the snapshot the
    caller already picked (`resume RUN_DIR` reads its recipe from it) with the shards this
    node holds; when a shard on another node fails it, the newest complete one is taken."""
    if not directory.is_dir():
        raise RefusedError(f"{directory} is not a run directory (no such directory)")
    lock.acquire()  # first: from here on no other process writes the directory
    run_json = read_run_json(directory)
    if run_json is None:
        raise RefusedError(f"{directory} holds no {RUN_JSON}, so it is not a run to continue "
                           "(start a fresh run there with train-sl)")
    if chosen is not None and snapshot_files(directory) != chosen.files:
        # The run that saved meanwhile has ended (we hold the lock now): name it.
        holder = last_holder(directory)
        raise RefusedError(f"{directory} changed while this command started: its run "
                           f"({describe_holder(holder)}) was still saving, and has ended "
                           "since; nothing was changed: run the command again")
    snapshot = chosen if chosen is not None else newest_snapshot(directory, parts=site.parts)
    if chosen is not None and site.elsewhere is not None and site.elsewhere(chosen.path,
                                                                           chosen.data):
        snapshot = newest_snapshot(directory, parts=site.parts)  # says why, or refuses
    if snapshot is not None and snapshot.run.get("run_id") != run_json.get("run_id"):
        raise RefusedError(
            f"{snapshot.path} belongs to run {snapshot.run.get('run_id')}, but {directory} "
            f"holds run {run_json.get('run_id')}, so it cannot continue there; nothing "
            "was changed. To continue that snapshot elsewhere: "
            + fresh_command(snapshot.path, directory, world_size=snapshot.run.get("world_size")))
    section = snapshot.run if snapshot is not None else {**run_json, "step": 0}
    _refuse_differences(str(snapshot.path) if snapshot is not None
                        else f"the run in {directory}", resume_problems(section,
                                                                        identity["config"],
                                                                        identity, again,
                                                                        schema))
    if snapshot is not None:
        check_rank_entries(snapshot.data, snapshot.path)
        _refuse_if_complete(snapshot, directory, max_updates, identity["config"])
    return _continue(snapshot, identity, directory, run_json, schema, site)


def _refuse_if_complete(snapshot: Snapshot, directory: Path, max_updates: int,
                        config: Mapping[str, Any]) -> None:
    if early := stopped_early(snapshot.run, config):  # complete too (R-MET-2)
        raise RunComplete(f"the run in {directory} is complete: it {early}. Nothing was "
                          "changed.")
    # A stop at the last update that skipped or cut short its validation left it due: the
    # resume runs it (R-EVAL-4).
    if snapshot.step >= max_updates and not snapshot.run.get("validation_due"):
        raise RunComplete(
            f"the run in {directory} is complete: update {snapshot.step} of "
            f"{max_updates} is saved in {snapshot.path.name}. Nothing was changed; to "
            f"train longer, add --set trainer.max_updates=N (N > {snapshot.step})")


def _continue(snapshot: Snapshot | None, identity: dict[str, Any], directory: Path,
              run_json: dict[str, Any] | None = None, schema: type[BaseModel] | None = None,
              site: _Site = _Site()) -> Prepared:
    """Continue the run in `directory` from `snapshot` keeping its identity: what the resume
    records (resume_record.InPlaceRecord: roll-back of history beyond the snapshot, the
    `resumed` event, keys newer than run.json's recipe at their default, data moved) is
    decided here and written by `commit`, once every rank has loaded (R-PREEMPT-2)."""
    run_json = run_json if run_json is not None else read_run_json(directory) or {}
    step = snapshot.step if snapshot is not None else 0
    notes = [snapshot.note] if snapshot is not None and snapshot.note else []
    resumed = {"step": step,
               "checkpoint": snapshot.path.name if snapshot is not None else None,
               "world_size": identity["world_size"],
               "config_sha256": identity["config_sha256"],
               # `--set trainer.max_updates=N` may raise it: readers take the newest
               # (runs/facts.planned_updates), run.json's config stays the one it began with.
               "max_updates": int(identity["config"]["trainer"]["max_updates"]),
               "best": identity.get("best"),  # trainer.best may change on resume
               # and so may trainer.deterministic: whether this stretch ran deterministic
               "deterministic": bool(identity["config"]["trainer"].get("deterministic")),
               "versions": identity.get("versions")}  # the packages this stretch runs with
    change = (world_size_change(snapshot.run.get("world_size"), identity["world_size"], step)
              if snapshot is not None else None)
    if change is not None:
        resumed["world_size_from"] = change["from"]
    if snapshot is not None and snapshot.note:
        resumed["note"] = snapshot.note
    added = keys_at_default(run_json.get("config") or {}, identity["config"], schema)
    if added:
        resumed["config_keys_added"] = sorted(added)
        notes.append(added_note(added))
    moves = moved(snapshot.run.get("config") or {} if snapshot is not None
                  else run_json.get("config") or {}, identity["config"], schema)
    if moves:
        resumed["data_moved"] = {k: {"from": a, "to": b} for k, (a, b) in moves.items()}
        notes.append(moved_note(moves))
    record = InPlaceRecord(directory, step, resumed, change, added, moves,
                           snapshot.damaged if snapshot is not None else ())
    continued = {**identity, "run_id": run_json.get("run_id"),
                 "created_at": run_json.get("created_at"),
                 "resumed_from": run_json.get("resumed_from")}
    payload = site.payload(snapshot) if snapshot is not None else None
    return Prepared(continued, payload, continued=True, notes=tuple(notes),
                    commit=record.commit,
                    snapshot=snapshot.path if snapshot is not None else None)
