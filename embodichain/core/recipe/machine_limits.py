"""What a recipe's size-like keys ask of the machine that runs it, before anything starts.

`trainer.data_workers: 100000` validates as a non-negative integer and then forks worker
processes until the memory is gone. The schema's fixed ceilings (recipe/limits.py) refuse
what no machine can serve; this module compares what is left with this machine: its
process limit, its available memory and its CPUs. A value the machine cannot serve is a
problem (exit 2, naming the key and the limit); a large but possible one is a warning,
given once. `validate-config` and `train-sl` both call `machine_verdict`, so they agree on
the machine they run on (`validate-config` counts one rank per node, as a plain
`train-sl` does). Torch-free: it reads /proc and resource limits only.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

from embodichain.core.recipe.schema import FrameworkConfig

# A forked data worker's own memory, at the least: the pages the child's reference
# counting and torch's worker loop touch. Observed: 1,600 workers of a small recipe held
# 24 GB (15 MB each), so 16 MiB is a floor, not an estimate.
WORKER_BYTES = 16 * 2**20
# One example in flight costs the training process at least its index (an int64 in the
# sampler's tensor) and its key `(index, update, position)` queued for a worker.
EXAMPLE_KEY_BYTES = 64
INDEX_BYTES = 8  # the update's indices: one int64 tensor of batch_size x grad_accumulation


@dataclass(frozen=True)
class Machine:
    """The facts of a machine that bound a run: None where it sets no limit."""

    cpus: int
    process_limit: int | None = None
    """Processes this user may start (RLIMIT_NPROC; a cgroup's pids.max less its own)."""
    memory_bytes: int | None = None
    """Memory available to new processes (MemAvailable, a cgroup's memory.max)."""

    @classmethod
    def this_one(cls) -> Machine:
        return cls(cpus=_cpus(), process_limit=_process_limit(), memory_bytes=_memory())


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def machine_verdict(config: FrameworkConfig, local_ranks: int = 1,
                    machine: Machine | None = None) -> Verdict:
    """The recipe's size-like keys against `machine` (this one by default), for
    `local_ranks` training processes on it."""
    machine = machine or Machine.this_one()
    t = config.trainer
    verdict = Verdict()
    ranks = max(1, local_ranks)
    workers = t.data_workers * ranks
    per = f" ({t.data_workers} per rank x {ranks} ranks)" if ranks > 1 else ""
    memory = machine.memory_bytes
    if t.data_workers:
        if machine.process_limit is not None and workers > machine.process_limit:
            verdict.problems.append(
                f"trainer.data_workers: {workers} worker processes{per} exceed the "
                f"{machine.process_limit} processes this user may still start on this "
                "machine (its process limit); lower trainer.data_workers")
        elif memory is not None and workers * WORKER_BYTES > memory:
            verdict.problems.append(
                f"trainer.data_workers: {workers} worker processes{per} need at least "
                f"{readable_size(workers * WORKER_BYTES)} ({readable_size(WORKER_BYTES)} each), "
                f"more than the {readable_size(memory)} of memory available on this machine; "
                f"at most {memory // WORKER_BYTES // ranks} per rank fit")
        elif workers > machine.cpus:
            verdict.warnings.append(
                f"trainer.data_workers: {workers} worker processes{per} on the "
                f"{machine.cpus} CPUs of this machine: they compete with training for the "
                "CPUs (the model is the same for any value; 2 to 8 per rank is usual)")
        # A loaded batch is the update, or under global_batch_size one micro-batch.
        per_batch = t.batch_size * (1 if t.global_batch_size else t.grad_accumulation)
        in_flight = t.data_workers * t.prefetch * per_batch
        if memory is not None and in_flight * EXAMPLE_KEY_BYTES > memory:
            verdict.problems.append(
                f"trainer.prefetch: {t.data_workers} workers x prefetch {t.prefetch} x "
                f"{per_batch} examples per {'micro-batch' if t.global_batch_size else 'update'}"
                f" = {in_flight:,} "
                f"examples in flight per rank, whose indices alone need "
                f"{readable_size(in_flight * EXAMPLE_KEY_BYTES)}, more than the "
                f"{readable_size(memory)} available on this machine; lower trainer.prefetch")
    drawn = t.global_batch_size or t.batch_size * t.grad_accumulation  # under G: every rank
    what = ("trainer.global_batch_size: an update draws" if t.global_batch_size else
            "trainer.grad_accumulation: an update draws batch_size x grad_accumulation =")
    if memory is not None and drawn * INDEX_BYTES > memory:
        verdict.problems.append(
            f"{what} "
            f"{drawn:,} indices at once, {readable_size(drawn * INDEX_BYTES)}, more than the "
            f"{readable_size(memory)} available on this machine")
    return verdict


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _process_limit() -> int | None:
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:  # root is exempt, but a limit set is the one meant
        limits.append(soft)
    pids_max, pids_now = _read_int("pids.max"), _read_int("pids.current")
    if pids_max is not None:
        limits.append(pids_max - (pids_now or 0))
    return min(limits) if limits else None


def _memory() -> int | None:
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    limit = _read_int("memory.max")
    if limit is not None:
        found.append(limit - (_read_int("memory.current") or 0))
    return min(found) if found else None


def _read_int(name: str) -> int | None:
    """A cgroup v2 value of this process's cgroup ("max" and absence: None)."""
    try:
        line = Path("/proc/self/cgroup").read_text().splitlines()[0]
        text = (Path("/sys/fs/cgroup") / line.split(":", 2)[2].lstrip("/") / name).read_text()
        return int(text.strip())
    except (OSError, ValueError, IndexError):
        return None


def readable_size(n: float) -> str:
    """Bytes in decimal units, as the refusals and the disk plan print them ("1.5 GB")."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover


def refuse_or_warn(config: FrameworkConfig, source: str | None, local_ranks: int = 1,
                   machine: Machine | None = None) -> list[str]:
    """Raise ConfigError (exit 2) for what this machine cannot serve; else the warnings."""
    from embodichain.core.errors import ConfigError

    verdict = machine_verdict(config, local_ranks, machine)
    if verdict.problems:
        raise ConfigError([f"{p}. Nothing was started" for p in verdict.problems], source)
    return verdict.warnings
