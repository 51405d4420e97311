"""How a run starts (R-DIST-5..7, R-RESUME-8): rank 0 decides, every rank learns it.

One gather brings rank 0 every rank's host and data identity; rank 0 alone inspects, locks
and claims the output directory and reads the snapshot (core/runs/resume_policy.py decides),
asking the other ranks, while it decides, whether their shards of a sharded snapshot verify;
then it sends every rank the outcome, so a refusal is decided (and printed) once and all
ranks exit with the same code, and each rank receives its part of the snapshot.
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
from embodichain.core.checkpoint.sharded import check_shard, shards_elsewhere
from embodichain.core.distributed import process_group
from embodichain.core.errors import RefusedError, TrainingError, UsageError
from embodichain.core.recipe.loading import Recipe
from embodichain.core.recipe.schema import config_sha256
from embodichain.core.runs.resume_policy import RunComplete, Start, prepare
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
    so no other node needs the file (nor the run directory). While rank 0 decides, it may
    ask the other ranks whether their shards of a sharded manifest verify (those its node
    does not hold): each answers for its own shard, so the snapshot chosen is complete on
    every node (R-RESUME-8) before anything is changed.
    """
    facts = {"rank": process_group.rank(), "host": socket.gethostname(),
             "source_identity": trainer.source.identity,
             "sees_run": start.kind == "auto"
             and bool(artifacts_in(Path(recipe.config.trainer.output_dir)))}
    peers = process_group.gather_to_rank_zero(facts)
    payload = None
    if process_group.is_rank_zero():
        outcome, payload = _prepare_on_rank_zero(recipe, trainer, start, lock, peers or [],
                                                 initialized_from)
        process_group.broadcast_from_rank_zero(outcome)
    else:
        outcome = _outcome_from_rank_zero()
    if outcome.refused is not None:
        process_group.wait_for_rank_zero_exit(outcome.origin)
        raise RefusedError(outcome.refused)
    if outcome.failed is not None:
        process_group.wait_for_rank_zero_exit(outcome.origin)
        raise TrainingError(f"preparing the run failed on rank 0: {outcome.failed}")
    if outcome.restore:  # each rank receives what its strategy restores from
        trainer.restore_from_rank_zero(payload)
    return outcome


def _prepare_on_rank_zero(recipe: Recipe, trainer: SupervisedTrainer, start: Start,
                          lock: RunLock, peers: list[dict[str, Any]],
                          initialized_from: dict[str, Any] | None = None
                          ) -> tuple[StartOutcome, dict[str, Any] | None]:
    """The outcome every rank hears, and the snapshot payload to restore (or None)."""
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
            "config": recipe.resolved,
            "resumed_from": None,
            "initialized_from": initialized_from,  # train-sl --init-from: the weights' source
            "best": trainer.best.as_dict(),  # the run's best metric (R-MET-1), for readers
        }
        _check_peers(peers, directory)
        prepared = prepare(start, identity, directory, lock, recipe.source,
                           type(recipe.config), elsewhere=_shards_elsewhere)
        lock.publish(identity["created_at"])
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
            prepared.payload)


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


def _shards_elsewhere(path: Path, data: Mapping[str, Any]) -> list[str]:
    """Rank 0, while it decides: what the ranks holding shards of manifest `data` that
    this node does not hold find wrong with them ([]: they verify). Each such rank reads
    only its own shard; the others answer None (one broadcast, one gather)."""
    ranks = [r for r in shards_elsewhere(data, path) if r < process_group.world_size()]
    if not ranks:  # a rank beyond this launch: its world size is refused afterwards
        return []
    process_group.broadcast_from_rank_zero(
        _ShardCheck(str(path.parent), data["payload"]["run"], data["payload"]["sharded"],
                    ranks))
    return [p for p in process_group.gather_to_rank_zero(None) or [] if p is not None]


@dataclass(frozen=True)
class _ShardCheck:
    """Rank 0's question to every rank: do your shards of this manifest verify? The
    manifest's directory as named (each node resolves it in its own working directory)."""

    directory: str
    run: dict[str, Any]
    sharded: dict[str, Any]
    ranks: list[int]

    def answer(self) -> str | None:
        """This rank's problem with its shard (None when it verifies or is not asked);
        never raises, so that rank 0 always hears from every rank."""
        rank = process_group.rank()
        if rank not in self.ranks:
            return None
        try:
            problem = check_shard(Path(self.directory),
                                  {"payload": {"run": self.run, "sharded": self.sharded}}, rank)
        except Exception as exc:
            problem = f"shard of rank {rank}: {type(exc).__name__}: {exc}"
        return None if problem is None else \
            f"{problem} (found by rank {rank} on {socket.gethostname()})"


def _outcome_from_rank_zero() -> StartOutcome:
    """On the other ranks: the outcome rank 0 decided, answering its shard checks first."""
    while isinstance(message := process_group.broadcast_from_rank_zero(None), _ShardCheck):
        process_group.gather_to_rank_zero(message.answer())
    return message


def versions(recipe: Recipe) -> dict[str, str]:
    found = {"python": platform.python_version(), "torch": str(torch.__version__),
             "embodichain": embodichain.__version__}
    module = sys.modules.get(getattr(recipe.factory, "__module__", "") or "")
    top = (module.__name__.split(".")[0] if module else "")
    if top and top != "embodichain":
        try:
            import importlib_metadata
            dists = importlib_metadata.packages_distributions().get(top, [])
            for dist in dists:
                found[dist] = importlib_metadata.version(dist)
        except Exception:
            pass
    return found
