"""Run a recipe on every worker: fresh, from a checkpoint, in place, or auto.

Rank 0 alone inspects, locks and claims the output directory and reads the checkpoint
(resume_policy decides how the run starts); it then sends every rank the outcome, so a
refusal is decided (and printed) once and all ranks exit with the same code (R-DIST-5,
design §9). SIGINT / SIGTERM stop every rank at the same update with a snapshot (R-SIG-1).
"""

from __future__ import annotations

import contextlib
import platform
import random
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import embodichain
from embodichain.core.checkpoint import initial_weights
from embodichain.core.checkpoint.initial_weights import InitFrom
from embodichain.core.checkpoint.sharded import check_shard, shards_elsewhere
from embodichain.core.data.samplers import stream_seed
from embodichain.core.distributed import determinism, process_group
from embodichain.core.distributed.stop_request import StopRequest
from embodichain.core.errors import (
    RefusedError,
    Stopped,
    TrainingError,
    UsageError,
    refusal_in_chain,
    refused_by_determinism,
)
from embodichain.core.observe.loggers import LoggingMetricsWriter, check_loggers
from embodichain.core.observe.progress import configure_logging, log
from embodichain.core.observe.summary import Status, print_run_summary
from embodichain.core.recipe.loading import Recipe
from embodichain.core.recipe.schema import config_sha256
from embodichain.core.runs.fresh_claim import ClaimSite, take_back
from embodichain.core.runs.resume_policy import (
    RunComplete,
    Start,
    config_differences,
    prepare,
    resume_problems,
)
from embodichain.core.runs.run_dir import artifacts_in, new_run_id, now_iso
from embodichain.core.runs.run_lock import RunLock
from embodichain.core.training.trainer import RunContext, SupervisedTrainer


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


def train(recipe: Recipe, *, start: Start | None = None, show_progress: bool = True,
          init_from: InitFrom | None = None) -> dict[str, float]:
    """Build the recipe's trainer on every rank, prepare the run directory and fit.

    `start` says how the run begins (fresh by default; see resume_policy.Start). This is
    the programmatic path (`build_trainer` inside `distributed_run`, then `fit()`) with the
    stop signals installed before the process group exists, so that a signal during
    set-up stops at the first update.
    """
    configure_logging(process_group.env_rank())
    check_loggers(recipe.config.trainer.loggers)  # a missing extra: refused before anything
    # First: cuBLAS and NCCL read their variables once, when CUDA work or the group starts.
    determinism.apply(recipe.config.trainer.deterministic)
    with StopRequest() as stop, process_group.distributed_run(recipe.config.device) as device:
        trainer = build_trainer(recipe, device, start=start, init_from=init_from)
        return trainer.fit(show_progress=show_progress, stop=stop)


def build_trainer(recipe: Recipe, device: torch.device, *, start: Start | None = None,
                  init_from: InitFrom | None = None) -> SupervisedTrainer:
    """The recipe's trainer from its factory, with the model initialised from the seed
    (on every rank alike); inside `distributed_run`, on every rank.

    Its `fit()` then runs as `train-sl` does (R-API-1): the run directory claimed, locked
    and resumed by `start`'s rules (fresh by default), stop signals honoured with a
    snapshot, the summary printed, and the trainer closed at the end. `init_from`: a new
    run whose model starts from those weights (rank 0 reads them, every rank loads them
    into the factory's model before its strategy spreads it); never with a resume.
    """
    start = start or Start()
    if init_from is not None and start.kind != "fresh":
        raise UsageError("--init-from starts a new run from a checkpoint's weights and "
                         f"--resume continues one ({start.kind}); give only one of them")
    weights = initial_weights.agree(init_from) if init_from is not None else None
    _seed_everything(recipe.config.seed)
    try:
        with initial_weights.pending(weights):
            trainer = recipe.factory(recipe.config, device)
    except Exception as exc:
        if isinstance(exc, UsageError) or refusal_in_chain(exc) is not None:
            _refused_by_the_factory()
        raise
    if not isinstance(trainer, SupervisedTrainer):
        raise UsageError(f"factory {recipe.config.factory} returned {type(trainer).__name__}, "
                         "not a SupervisedTrainer")
    trainer.run_opener = RunOpener(recipe, start, device,
                                   weights.record if weights is not None else None)
    return trainer


def _refused_by_the_factory() -> None:
    """Every rank's factory refuses the same data (or recipe), each on its own: let each end
    with exit 2. torchrun stops the other workers with SIGTERM once the first has exited;
    one still in its factory only records it (StopRequest) and refuses in turn, and from
    here on this rank ignores it, so that its own code, not -15, is what torchrun reports
    (and a self-launch sees a refusal on every worker: not retried, R-PROC-3)."""
    if process_group.is_distributed():
        with contextlib.suppress(ValueError):  # not the main thread: cannot change it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


@dataclass
class RunOpener:
    """What a built trainer's first `fit()` runs: the run around the fit loop."""

    recipe: Recipe
    start: Start
    device: torch.device
    initialized_from: dict[str, Any] | None = None  # run.json's record of --init-from

    def __call__(self, trainer: SupervisedTrainer, show_progress: bool,
                 stop: StopRequest | None) -> dict[str, float]:
        config = self.recipe.config
        if not log.handlers:  # a program that calls fit() itself: train-sl's logging
            configure_logging(process_group.env_rank())
        check_loggers(config.trainer.loggers)
        # Again for a program's own distributed_run + fit() (train() has set it already).
        for note in determinism.apply(config.trainer.deterministic):
            if process_group.is_rank_zero():
                log.info("%s", note)
        lock = RunLock(Path(config.trainer.output_dir))
        with contextlib.ExitStack() as scope:
            if stop is None:  # a program's own fit(): signals stop it as they stop train-sl
                stop = scope.enter_context(StopRequest())
            scope.callback(lock.release)
            scope.callback(trainer.close)
            # Ranks share the model init; from here on each has its own streams.
            _seed_everything(stream_seed(config.seed, process_group.rank()) % (2**32))
            outcome = _agree_on_start(self.recipe, trainer, self.start, lock,
                                      self.initialized_from)
            if outcome.complete is not None:
                if process_group.is_rank_zero():
                    log.info("%s", outcome.complete)
                return {}
            _attach_run(trainer, self.recipe, outcome, self.device)
            return _fit_and_summarize(trainer, stop, show_progress, outcome.claimed)


def check_by_building(recipe: Recipe) -> None:
    """Build the recipe's trainer in this process and close it again, training nothing and
    writing nothing: what only the factory decides (its parameter groups, its source, an
    evaluate for trainer.save_best) is refused as train-sl would refuse it (UsageError)."""
    configure_logging(0)  # the build's warnings, as train-sl shows them
    with process_group.distributed_run(recipe.config.device) as device:
        build_trainer(recipe, device).close()


def _attach_run(trainer: SupervisedTrainer, recipe: Recipe, outcome: StartOutcome,
                device: torch.device) -> None:
    """Give the trainer its run directory, identity and (rank 0) metrics writer."""
    config = recipe.config
    directory = Path(config.trainer.output_dir)
    continued = outcome.continued
    assert outcome.identity is not None
    metrics = None
    if process_group.is_rank_zero():
        metrics = LoggingMetricsWriter(directory, config.trainer.loggers,
                                       trainer.step if continued else None,
                                       identity=outcome.identity)
    trainer.attach(RunContext(directory, outcome.identity, metrics))
    if process_group.is_rank_zero():
        for note in outcome.notes:
            log.info("%s", note)
        log.info("run %s: %s in %s (world size %d, device %s)",
                 outcome.identity["run_id"][:12],
                 f"resuming at update {trainer.step}" if continued else "training",
                 directory, process_group.world_size(), device)


def _fit_and_summarize(trainer: SupervisedTrainer, stop: StopRequest, show_progress: bool,
                       claimed: dict[str, Any] | None = None) -> dict[str, float]:
    """Fit; whatever the end, rank 0 then says what exists and how to continue (R-UX-2).

    The error itself is printed after the summary, by the CLI. A closed stdout must not
    turn a finished run into a failure. A freshly `claimed` directory is given back when the
    run ends before its first update (runs/fresh_claim).
    """
    start_step, started = trainer.step, time.perf_counter()
    status: Status = "failed"
    try:
        final = trainer.fit(show_progress=show_progress, stop=stop)
        status = "finished"
        return final
    except (Stopped, KeyboardInterrupt):
        status = "stopped"
        raise
    except Exception as exc:  # an operation trainer.deterministic refuses: say so, plainly
        if (refused := refused_by_determinism(exc, trainer.step + 1)) is None:
            raise
        raise refused from exc
    finally:
        if process_group.is_rank_zero() and not (
                status != "finished" and claimed and trainer.step == start_step
                and _give_back(trainer, claimed)):
            with contextlib.suppress(OSError):
                print_run_summary(trainer.run_directory, status=status, start_step=start_step,
                                  end_step=trainer.step, wall_s=time.perf_counter() - started)


def _give_back(trainer: SupervisedTrainer, claimed: dict[str, Any]) -> bool:
    """Undo the claim of a run that did no update (rank 0); whether anything was removed."""
    directory = trainer.run_directory
    removed = take_back(ClaimSite.from_json(claimed), trainer.run.identity["run_id"])
    if removed:
        log.info("the run ended before its first update: removed what it had created in %s "
                 "(%s), so the same command can start it again", directory, ", ".join(removed))
    return bool(removed)


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % (2**32))
    except ImportError:
        pass


def _agree_on_start(recipe: Recipe, trainer: SupervisedTrainer, start: Start, lock: RunLock,
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


__all__ = ["train", "resume_problems", "config_differences"]
