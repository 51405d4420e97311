"""How a run starts (R-DIST-5..7, R-RESUME-8, R-PREEMPT-2): rank 0 decides, every rank
learns it, and a resume is recorded only once every rank has loaded.

One gather brings rank 0 every rank's host and data identity; rank 0 alone inspects, locks
and claims the output directory and reads the snapshot (core/runs/resume_policy.py decides),
asking every node, while it decides, which parts of the snapshot it holds (an FSDP
manifest's shards, as the strategy's checkpoint format names them) and having one holder of
each verify it; then it sends every rank the outcome, so a refusal is decided (and printed)
once and all ranks exit with the same code, and each rank receives its part of the snapshot.
Every rank then loads its state and says whether it could; only when all could does rank 0
write what the resume records (resume_record.py). A load that fails is refused (exit 2)
naming the cause and the versions the checkpoint was written with; nothing was changed.
"""

from __future__ import annotations

import platform
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import embodichain
from embodichain.core.checkpoint.formats import CheckpointFormat, this_node
from embodichain.core.checkpoint.tensor_names import TensorMismatch
from embodichain.core.distributed import process_group
from embodichain.core.errors import EmbodichainError, RefusedError, TrainingError, UsageError
from embodichain.core.recipe.loading import Recipe
from embodichain.core.recipe.schema import config_sha256
from embodichain.core.runs.resume_policy import Prepared, RunComplete, Start, prepare
from embodichain.core.runs.resume_record import Committed
from embodichain.core.runs.run_dir import artifacts_in, new_run_id, now_iso
from embodichain.core.runs.run_lock import RunLock
from embodichain.core.training.trainer import SupervisedTrainer


@dataclass
class StartOutcome:
    """How the run starts, as rank 0 decided it and every rank hears it: exactly one of
    `identity` (the run goes ahead), `complete`, `refused` (exit 2) or `failed` (exit 1)."""

    identity: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    continued: bool = False  # resumed: from a snapshot, or an earlier run restarted at 0
    restore: bool = False  # a snapshot payload follows, each rank receiving its part
    claimed: dict[str, Any] | None = None  # a fresh claim: what the directory held before
    complete: str | None = None  # the run had already reached its end: why
    refused: str | None = None
    failed: str | None = None
    origin: dict[str, Any] = field(default_factory=dict)  # rank 0's process, on a refusal



def agree_on_start(recipe: Recipe, trainer: SupervisedTrainer, start: Start, lock: RunLock,
                    initialized_from: dict[str, Any] | None = None) -> StartOutcome:
    """Rank 0 decides how the run starts; every rank learns the outcome and restores its part.

    One gather brings rank 0 every rank's host, data identity and (for `--resume auto`)
    whether it sees a run in its own output_dir (R-DIST-7, R-DIST-6). Rank 0 alone reads
    the snapshot; it broadcasts the common state and scatters each rank only its own part,
    so no other node needs the file (nor the run directory). While rank 0 decides, it asks
    every node which parts of a snapshot it holds (`_PartsHeld`), and one holder of each
    part this node lacks whether it verifies (`_PartsCheck`), so the snapshot chosen is
    complete in this world (R-RESUME-8) before anything is changed. What the resume
    records is written once every rank has loaded (`_agree_loaded`, R-PREEMPT-2).
    """
    facts = {"rank": process_group.rank(), "host": socket.gethostname(),
             "source_identity": trainer.source.identity,
             "sees_run": start.kind == "auto"
             and bool(artifacts_in(Path(recipe.config.trainer.output_dir)))}
    peers = process_group.gather_to_rank_zero(facts)
    fmt = trainer.learner.strategy.checkpoint_format
    payload, prepared = None, None
    if process_group.is_rank_zero():
        outcome, prepared = _prepare_on_rank_zero(recipe, trainer, start, lock, peers or [],
                                                  fmt, initialized_from)
        payload = prepared.payload if prepared is not None else None
        process_group.broadcast_from_rank_zero(outcome)
    else:
        outcome = _outcome_from_rank_zero(fmt)
    _raise_if_stopped(outcome)
    if outcome.identity is not None:  # the run goes ahead: load, agree, then record
        verdict = _agree_loaded(trainer, outcome, payload, prepared, recipe, lock)
        _raise_if_stopped(verdict)
        outcome.notes += verdict.notes
        outcome.claimed = verdict.claimed
    return outcome


def _raise_if_stopped(outcome: StartOutcome) -> None:
    if outcome.refused is not None:
        process_group.wait_for_rank_zero_exit(outcome.origin)
        raise RefusedError(outcome.refused)
    if outcome.failed is not None:
        process_group.wait_for_rank_zero_exit(outcome.origin)
        raise TrainingError(f"preparing the run failed on rank 0: {outcome.failed}")


def _agree_loaded(trainer: SupervisedTrainer, outcome: StartOutcome,
                  payload: dict[str, Any] | None, prepared: Prepared | None, recipe: Recipe,
                  lock: RunLock) -> StartOutcome:
    """Every rank loads its part of the snapshot (when there is one) and says whether it
    could (one gather); rank 0 then records the resume (`prepared.commit`) and publishes
    the lock, or refuses naming each rank's problem; every rank hears the verdict (one
    broadcast). So nothing is written before every rank has loaded (R-PREEMPT-2)."""
    problem = None
    if outcome.restore:  # each rank receives what its strategy restores from
        try:
            trainer.restore_from_rank_zero(payload)
        except Exception as exc:  # every rank reaches the gather: none waits alone
            problem = (isinstance(exc, TensorMismatch),
                       str(exc) if isinstance(exc, EmbodichainError)
                       else f"{type(exc).__name__}: {exc}")
    problems = process_group.gather_to_rank_zero(problem)
    if not process_group.is_rank_zero():
        return process_group.broadcast_from_rank_zero(None)
    assert prepared is not None
    verdict = StartOutcome()
    failed = [(rank, p) for rank, p in enumerate(problems or []) if p is not None]
    try:
        if failed:
            verdict.refused = _load_refusal(failed, prepared, recipe)
        else:
            committed = prepared.commit() if prepared.commit is not None else Committed()
            verdict.notes = list(committed.notes)
            verdict.claimed = committed.claimed.as_json() if committed.claimed else \
                outcome.claimed
            lock.publish(outcome.identity["created_at"] if outcome.identity else now_iso())
    except UsageError as exc:
        verdict.refused = str(exc)
    except Exception as exc:
        verdict.failed = f"{type(exc).__name__}: {exc}"
    if verdict.refused is not None or verdict.failed is not None:
        verdict.origin = process_group.rank_zero_origin()
    return process_group.broadcast_from_rank_zero(verdict)


def _load_refusal(failed: list[tuple[int, tuple[bool, str]]], prepared: Prepared,
                  recipe: Recipe) -> str:
    """Why the snapshot could not be loaded: each rank's problem (said once when every rank
    has the same), and the versions it was written with against this run's."""
    messages = {p for _, (_, p) in failed}
    if len(messages) == 1:
        ranks = ", ".join(str(r) for r, _ in failed)
        causes = f"{failed[0][1][1]} (rank{'s' if len(failed) > 1 else ''} {ranks})"
    else:
        causes = "; ".join(f"rank {r}: {p}" for r, (_, p) in failed)
    saved = (prepared.payload or {}).get("run", {}).get("versions") or {}
    now = prepared.identity.get("versions") or {}
    where = prepared.snapshot or recipe.config.trainer.output_dir
    unchanged = "Nothing was changed: run.json, metrics.jsonl and the checkpoints are as " \
        "they were."
    if any(model for _, (model, _) in failed):  # the code changed under the checkpoint
        return (f"cannot resume from {where}: its state does not load into this run's "
                f"model: {causes}. {_versions_compared(saved, now)} {unchanged} Resume with "
                "the version that wrote the checkpoint, or start a new run from its weights "
                "with train-sl --init-from CHECKPOINT.")
    return f"cannot resume from {where}: loading its state failed: {causes}. {unchanged}"


def _versions_compared(saved: Mapping[str, str], now: Mapping[str, str]) -> str:
    """`written with renaming 0.1 (now 0.2); the same python, torch, embodichain`."""
    changed = [f"{name} {saved.get(name, 'absent')} (now {now.get(name, 'absent')})"
               for name in sorted(set(saved) | set(now)) if saved.get(name) != now.get(name)]
    same = [name for name in sorted(saved) if saved.get(name) == now.get(name)]
    if not saved:
        return "The checkpoint records no versions (this run: " + ", ".join(
            f"{k} {v}" for k, v in sorted(now.items())) + ")."
    text = ("The checkpoint was written with " + ", ".join(changed) if changed
            else "The checkpoint was written with the same versions")
    return text + (f"; the same {', '.join(same)}." if same and changed else ".")


def _prepare_on_rank_zero(recipe: Recipe, trainer: SupervisedTrainer, start: Start,
                          lock: RunLock, peers: list[dict[str, Any]], fmt: CheckpointFormat,
                          initialized_from: dict[str, Any] | None = None
                          ) -> tuple[StartOutcome, Prepared | None]:
    """The outcome every rank hears, and what rank 0 decided (its payload to restore and
    what to record once every rank has loaded), or None."""
    directory = Path(recipe.config.trainer.output_dir)
    try:  # whatever fails here, the other ranks wait for an outcome: they must hear of it
        identity = {
            "run_id": new_run_id(),
            "created_at": now_iso(),
            "factory": recipe.config.factory,
            "config_sha256": config_sha256(recipe.resolved),
            "source_identity": trainer.source.identity,
            "world_size": process_group.world_size(),
            "versions": versions(recipe),
            "environment": environment(trainer.device),  # what `reproduce` compares
            "config": recipe.resolved,
            "resumed_from": None,
            "initialized_from": initialized_from,  # train-sl --init-from: the weights' source
            "best": trainer.best.as_dict(),  # the run's best metric (R-MET-1), for readers
        }
        _check_peers(peers, directory)
        prepared = prepare(start, identity, directory, lock, recipe.source,
                           type(recipe.config), checkpoint_format=fmt,
                           elsewhere=lambda path, data: _parts_elsewhere(fmt, path, data))
    except RunComplete as done:
        return StartOutcome(complete=str(done)), None
    except UsageError as exc:
        return StartOutcome(refused=str(exc), origin=process_group.rank_zero_origin()), None
    except Exception as exc:
        return StartOutcome(failed=f"{type(exc).__name__}: {exc}",
                            origin=process_group.rank_zero_origin()), None
    return (StartOutcome(identity=prepared.identity, notes=list(prepared.notes),
                         continued=prepared.continued, restore=prepared.payload is not None,
                         claimed=prepared.claimed.as_json() if prepared.claimed else None),
            prepared)


def _check_peers(peers: list[dict[str, Any]], directory: Path) -> None:
    """Refuse when ranks train on different data (R-DIST-7), or when, with `--resume auto`,
    another node sees a run that rank 0 does not (the run lives where rank 0 runs)."""
    by_identity: dict[str, list[dict[str, Any]]] = {}
    for peer in peers:
        by_identity.setdefault(peer["source_identity"], []).append(peer)
    if len(by_identity) > 1:
        sides = "\n".join(
            f"  - {identity}: " + ", ".join(f"rank {p['rank']} on {p['host']}" for p in group)
            for identity, group in by_identity.items())
        raise RefusedError("the ranks do not train on the same data: their source identities "
                           f"differ\n{sides}\nGive every node identical data files (NeRD's "
                           "prepare is deterministic: run it with the same arguments on each "
                           "node). Nothing was started.")
    if peers and not peers[0]["sees_run"]:
        elsewhere = [p for p in peers[1:] if p["sees_run"]]
        if elsewhere:
            holders = ", ".join(f"rank {p['rank']} on {p['host']}" for p in elsewhere)
            raise RefusedError(
                f"--resume auto: rank 0 on {peers[0]['host']} finds no run in {directory}, but "
                f"{holders} finds one in its own {directory}. The run directory lives where global "
                "rank 0 runs; this rendezvous put rank 0 on another machine. Start again with "
                f"the node that holds the run as node rank 0 (or copy {directory} there); "
                "nothing was started, so the run is not started over.")


def _parts_elsewhere(fmt: CheckpointFormat, path: Path, data: Mapping[str, Any]
                     ) -> list[str]:
    """Rank 0, while it decides: what is wrong with the parts of checkpoint `data` (at
    `path`) that this node does not hold, as the nodes of this world find them ([]: each is
    held by some node and verifies). Every rank says which parts it sees (`_PartsHeld`);
    a part no node holds is named with its file and the node that wrote it; each other one
    is verified by its lowest holder (`_PartsCheck`). Whichever rank will read or send a
    part in the restore (recut_exchange), it lies on some node of this world."""
    missing = fmt.parts_elsewhere(data, path)
    if not missing or not process_group.is_distributed():
        return [fmt.unreachable(data, path, k, [this_node()]) for k in missing]
    question = _PartsHeld(str(path), fmt.parts_view(data))
    process_group.broadcast_from_rank_zero(question)
    held = process_group.gather_to_rank_zero(question.answer(fmt)) or []
    nodes = [list(n) for n in sorted({tuple(h["node"]) for h in held})]
    problems, assigned = [], {}
    for k in missing:
        holders = [r for r, h in enumerate(held) if k in h["seen"]]
        if holders:
            assigned.setdefault(holders[0], []).append(k)
        else:
            problems.append(fmt.unreachable(data, path, k, nodes))
    if problems:  # the other ranks wait for rank 0's next question or its outcome
        return problems
    check = _PartsCheck(question, assigned)
    process_group.broadcast_from_rank_zero(check)
    return [p for p in process_group.gather_to_rank_zero(check.answer(fmt)) or []
            if p is not None]


@dataclass(frozen=True)
class _PartsHeld:
    """Rank 0's question to every rank: which parts of this checkpoint do you see? The
    manifest's directory as named (each node resolves it in its own working directory)."""

    path: str
    data: dict[str, Any]  # what the format's questions read (`parts_view`), no tensors

    def answer(self, fmt: CheckpointFormat) -> dict[str, Any]:
        """The parts this rank sees and its node; never raises (rank 0 hears every rank)."""
        try:
            seen = fmt.parts_seen(self.data, Path(self.path))
        except Exception:
            seen = []
        return {"seen": seen, "node": this_node()}


@dataclass(frozen=True)
class _PartsCheck:
    """Rank 0's request: verify the parts assigned to you (rank -> parts)."""

    held: _PartsHeld
    assigned: dict[int, list[int]]

    def answer(self, fmt: CheckpointFormat) -> str | None:
        """This rank's problems with its assigned parts (None when they verify or it has
        none); never raises, so that rank 0 always hears from every rank."""
        rank = process_group.rank()
        found = []
        for k in self.assigned.get(rank, ()):
            try:
                problem = fmt.check_part(Path(self.held.path).parent, self.held.data, k)
            except Exception as exc:
                problem = f"part {k}: {type(exc).__name__}: {exc}"
            if problem is not None:
                found.append(f"{problem} (found by rank {rank} on {socket.gethostname()})")
        return "; ".join(found) or None


def _outcome_from_rank_zero(fmt: CheckpointFormat) -> StartOutcome:
    """On the other ranks: the outcome rank 0 decided, answering its questions first."""
    while isinstance(message := process_group.broadcast_from_rank_zero(None),
                     (_PartsHeld, _PartsCheck)):
        process_group.gather_to_rank_zero(message.answer(fmt))
    return message


def environment(device: torch.device) -> dict[str, str]:
    """Where this run runs, beside its versions (run.json): the platform and machine, and
    the device rank 0 trains on (a GPU by its name, with CUDA's and cuDNN's versions)."""
    found = {"platform": platform.platform(), "machine": platform.machine(),
             "device": device.type}
    if device.type == "cuda":
        found["device"] = f"cuda: {torch.cuda.get_device_name(device)}"
        found["cuda"] = str(torch.version.cuda)
        found["cudnn"] = str(torch.backends.cudnn.version())
    return found


def versions(recipe: Recipe) -> dict[str, str]:
    """The versions this run runs with (run.json, each checkpoint, each `resumed` event):
    python, torch, embodichain and the factory's distribution; a factory outside any
    installed distribution by its package's `__version__`, when it declares one."""
    found = {"python": platform.python_version(), "torch": str(torch.__version__),
             "embodichain": embodichain.__version__}
    module = sys.modules.get(getattr(recipe.factory, "__module__", "") or "")
    top = (module.__name__.split(".")[0] if module else "")
    if top and top != "embodichain":
        from importlib import metadata

        try:
            dists = metadata.packages_distributions().get(top, [])
            for dist in dists:
                found[dist] = metadata.version(dist)
        except Exception:  # a broken installation's metadata: versions are for readers
            dists = []
        declared = getattr(sys.modules.get(top), "__version__", None)
        if not dists and isinstance(declared, str):
            found[top] = declared
    return found
