"""Batches for the trainer: gathered from a `Source`, or loaded by torch's DataLoader (§11).

A `DatasetSource` is loaded by a DataLoader with `trainer.data_workers` processes, fed
through its `batch_sampler` with the index stream of a look-ahead copy of the rank's
sampler. The trainer's own sampler advances only when a batch is consumed, so a checkpoint
holds the consumed position: batches prefetched but not used at a snapshot do not count
(R-DATA-3), and a resume with any worker count continues the same stream.

Each example is loaded with torch's, Python's and NumPy's global generators seeded from
(seed, rank, update, position in the update) (R-DATA-2); in the training process
(`data_workers: 0`) the streams are restored afterwards, so dropout keeps its sequence.
Results therefore depend neither on the worker count nor on the prefetch depth.

Under `trainer.global_batch_size` (R-ELASTIC-2) the sampler is a `GlobalOrderSampler`: each
loaded batch is one micro-batch of `batch_size` (K per update, loaded as the learner reaches
them, so memory is bounded by the micro-batch), and each example is seeded from (seed,
update, position in the global batch), never the rank: any world size augments alike.

A failing `__getitem__` comes back as a value naming the example; a worker that dies is
reported by torch (its SIGCHLD handler or its liveness check); both become a DataFailure
(exit 1) on the rank that loads the batch (R-DATA-4). The other ranks then fail in the
update's all-reduce, or are stopped by the launcher: none waits forever. A stop signal is
its rank's alone: data workers ignore it and end with their rank (worker_signals,
R-PREEMPT-1).
"""

from __future__ import annotations

import atexit
import copy
import hashlib
import multiprocessing
import random
import signal
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from embodichain.core.data.dataset_source import DatasetSource
from embodichain.core.data.global_order import GlobalOrderSampler
from embodichain.core.data.micro_batches import Batch, MicroBatches, split_batch
from embodichain.core.data.prefetch import DevicePrefetch, PrefetchedMicroBatches
from embodichain.core.data.samplers import EpochSampler, Sampler
from embodichain.core.data.source import Source
from embodichain.core.data.worker_signals import end_left_over, started, starting_workers
from embodichain.core.errors import DataFailure

try:  # NumPy is optional; its global generator is seeded per example when importable.
    import numpy
except ImportError:  # pragma: no cover
    numpy = None  # type: ignore[assignment]

Key = tuple[int, int, int]  # (example index, update, position in the update)


def example_seed(seed: int, rank: int, update: int, position: int) -> int:
    """The 63-bit seed of the example at `position` of `update` on `rank`."""
    text = f"embodichain-example:{seed}:{rank}:{update}:{position}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def global_example_seed(seed: int, update: int, position: int) -> int:
    """The 63-bit seed of the example at global `position` of `update` (under G)."""
    text = f"embodichain-global-example:{seed}:{update}:{position}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


class LoadFailure:
    """What a worker sends back instead of a batch when an example could not be loaded."""

    def __init__(self, key: Key | None, message: str) -> None:
        self.key, self.message = key, message


class SeededExamples:
    """The dataset as the DataLoader sees it: indexed by keys, each example seeded
    (`rank` None: by its global position, under G)."""

    def __init__(self, dataset: Any, seed: int, rank: int | None) -> None:
        self.dataset, self.seed, self.rank = dataset, seed, rank

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Key) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[Key]) -> list[Any]:
        """A batch's examples (the DataLoader's fetcher calls this once per batch). In the
        training process the global streams are saved once and restored after the batch."""
        in_worker = torch.utils.data.get_worker_info() is not None
        saved = None if in_worker else _capture_global_rng()
        try:
            return [self._load(key) for key in keys]
        finally:
            if saved is not None:
                _restore_global_rng(saved)

    def _load(self, key: Key) -> Any:
        _seed_global_rng(example_seed(self.seed, self.rank, key[1], key[2])
                         if self.rank is not None
                         else global_example_seed(self.seed, key[1], key[2]))
        try:
            return self.dataset[key[0]]
        except Exception as exc:  # reported with its index by the training process
            return LoadFailure(key, f"{type(exc).__name__}: {exc}")


def _seed_global_rng(seed: int) -> None:
    torch.default_generator.manual_seed(seed)  # CPU only: CUDA streams are the trainer's
    random.seed(seed)
    if numpy is not None:
        numpy.random.seed(seed % (2**32))


def _capture_global_rng() -> tuple[Any, ...]:
    return (torch.default_generator.get_state(), random.getstate(),
            numpy.random.get_state() if numpy is not None else None)


def _restore_global_rng(saved: tuple[Any, ...]) -> None:
    torch.default_generator.set_state(saved[0])
    random.setstate(saved[1])
    if saved[2] is not None:
        numpy.random.set_state(saved[2])


def collate(examples: list[Any]) -> Any:
    """Stack a batch of examples; a failed example (or a failed stacking) is passed on."""
    for example in examples:
        if isinstance(example, LoadFailure):
            return example
    try:
        return torch.utils.data.default_collate(examples)
    except Exception as exc:
        return LoadFailure(None, f"stacking the batch failed: {type(exc).__name__}: {exc}")


class IndexStream:
    """The DataLoader's `batch_sampler`: the look-ahead sampler's batches as keys, forever.
    Under G each update's slice is cut into micro-batches of `micro_batch_size`, each key
    carrying its position in the global batch."""

    def __init__(self, sampler: Sampler, micro_batch_size: int | None = None) -> None:
        self.sampler, self.micro_batch_size = sampler, micro_batch_size

    def __iter__(self) -> Iterator[list[Key]]:
        while True:
            update = self.sampler.batches_drawn  # one draw per update (all its micro-batches)
            indices = self.sampler.next_indices().tolist()
            if not isinstance(self.sampler, GlobalOrderSampler):
                yield [(i, update, j) for j, i in enumerate(indices)]
                continue
            first, size = self.sampler.first_position, self.micro_batch_size or len(indices)
            keys = [(i, update, first + j) for j, i in enumerate(indices)]
            for start in range(0, len(keys), size):
                yield keys[start:start + size]


class BatchLoader:
    """`next_update()` gives the rank's micro-batches of the next update on the training
    device (one unless `trainer.grad_accumulation`), for either kind of source.

    An in-memory source's micro-batches are gathered lazily, one at a time; a
    `DatasetSource`'s update is loaded by the data workers as one batch (`next_batch()`:
    its examples are seeded by their position in the update), then cut in order; under G
    (a `GlobalOrderSampler`) as K batches of one micro-batch each, loaded in turn.
    """

    def __init__(self, source: Source, sampler: Sampler, device: torch.device, *, seed: int,
                 rank: int, workers: int = 0, prefetch: int = 2,
                 micro_batch_size: int | None = None, worker_timeout_s: float = 0.0) -> None:
        self.source, self.sampler, self.device = source, sampler, device
        self.worker_timeout_s = worker_timeout_s  # a batch's wait for the workers (0: none)
        self.seed, self.rank = seed, rank
        self.workers, self.prefetch = workers, prefetch
        self.micro_batch_size = micro_batch_size  # None: the update is one batch
        self._iterator: Iterator[Any] | None = None
        self._consumed = -1  # the sampler position the iterator's next batch starts at
        self._sigchld: Any = None
        self._waiting = False  # in next(): a worker's death may be raised at once
        self._death: DataFailure | None = None  # one seen elsewhere, raised at the next batch
        self._in_turn: InTurn | None = None  # under G: the update being loaded
        # On CUDA, in-memory batches one micro-batch ahead (prefetch.py): drawn from a
        # look-ahead copy of the sampler, which the sampler itself follows as consumed.
        self._prefetch = (DevicePrefetch(source.gather, device) if device.type == "cuda"
                          and not isinstance(source, DatasetSource) else None)
        self._ahead: Sampler | None = None
        self._ahead_at = -1
        self._upcoming: PrefetchedMicroBatches | None = None

    @property
    def global_order(self) -> bool:
        return isinstance(self.sampler, GlobalOrderSampler)

    def next_update(self) -> Sequence[Batch]:
        """The next update's micro-batches, in the order their indices were drawn."""
        if isinstance(self.source, DatasetSource) and self.global_order:
            if self._in_turn is not None:
                self._in_turn.finish()  # a previous update left unread stays in step
            share = self.sampler.share  # type: ignore[attr-defined]
            count = -(-share // (self.micro_batch_size or share))
            self._in_turn = InTurn(self._next_micro_batch, count)
            return self._in_turn
        if isinstance(self.source, DatasetSource):
            batch = self.next_batch()
            return split_batch(batch, self.micro_batch_size) if self.micro_batch_size \
                else [batch]
        if self._prefetch is not None:
            return self._prefetched_update()
        indices = self.sampler.next_indices()
        return MicroBatches(indices, self.micro_batch_size or len(indices), self._gather)

    def _prefetched_update(self) -> Sequence[Batch]:
        """This update's micro-batches (its first already sent), and the next update's first
        sent now, while this one computes. The sampler advances as each update is consumed
        (a checkpoint keeps that position); its look-ahead copy restarts from it when it was
        restored meanwhile."""
        assert self._prefetch is not None
        if self._ahead is None or self._ahead_at != self.sampler.batches_drawn:
            self._ahead, self._upcoming = copy.deepcopy(self.sampler), None
        current = self._upcoming or self._send(self._ahead.next_indices())
        self.sampler.next_indices()  # the same draw as the look-ahead's: consumed
        self._ahead_at = self.sampler.batches_drawn
        self._upcoming = self._send(self._ahead.next_indices())
        return current

    def _send(self, indices: torch.Tensor) -> PrefetchedMicroBatches:
        assert self._prefetch is not None
        return self._prefetch.update(indices, self.micro_batch_size or len(indices))

    def _gather(self, indices: torch.Tensor) -> Batch:
        batch = self.source.gather(indices)
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _next_micro_batch(self, k: int, last: bool) -> Batch:
        """Under G: micro-batch `k` of the next update; the sampler advances after the last."""
        return self.next_batch(first=k == 0, last=last)

    def next_batch(self, first: bool = True, last: bool = True) -> Batch:
        """A `DatasetSource`'s next update as one batch, loaded by the data workers (under
        G: one micro-batch of it, `first` and `last` saying which)."""
        if first and (self._iterator is None or self._consumed != self.sampler.batches_drawn):
            self._start()  # first batch, or the sampler was restored meanwhile
        update = self.sampler.batches_drawn + 1
        try:
            assert self._iterator is not None
            self._waiting = True
            if self._death is not None:  # a worker that died while the rank was elsewhere
                raise self._death
            loaded = next(self._iterator)
        except DataFailure:
            raise
        except Exception as exc:  # a worker died, or the DataLoader itself failed
            raise self._failure(exc, update) from None
        finally:
            self._waiting = False
        if isinstance(loaded, LoadFailure):
            self.close()
            raise self._failure(loaded, update)
        if last:
            self.sampler.next_indices()  # the consumed position is what a checkpoint keeps
            self._consumed = self.sampler.batches_drawn
        return {k: v.to(self.device, non_blocking=True) for k, v in loaded.items()}

    def metrics(self) -> dict[str, float]:
        """Per-update records of the sampling (`train/epoch` in epochs)."""
        epoch = getattr(self.sampler, "epoch", None) if isinstance(
            self.sampler, (EpochSampler, GlobalOrderSampler)) else None
        return {} if epoch is None else {"train/epoch": epoch}

    def _start(self) -> None:
        self.close()
        self._death = None  # the dead worker's loader is gone with it
        from torch.utils.data import DataLoader

        assert isinstance(self.source, DatasetSource)
        workers = self.workers
        fork = workers > 0 and "fork" in multiprocessing.get_all_start_methods()
        loader = DataLoader(
            SeededExamples(self.source.dataset, self.seed,
                           None if self.global_order else self.rank),
            batch_sampler=IndexStream(copy.deepcopy(self.sampler),
                                      self.micro_batch_size if self.global_order else None),
            num_workers=workers,
            collate_fn=collate,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=self.prefetch if workers > 0 else None,
            # Forked workers share the dataset's memory instead of unpickling a copy each.
            multiprocessing_context="fork" if fork else None,
            # The workers' base seed from a generator of its own, not the global torch
            # stream: starting (or restarting) the loader leaves training streams alone.
            generator=torch.Generator().manual_seed(0),
            # Stop signals are for the rank: its workers ignore them (R-PREEMPT-1).
            worker_init_fn=started if workers > 0 else None,
            # A worker stuck in `__getitem__` is named instead of hanging the run (R-OPS-1).
            timeout=self.worker_timeout_s if workers > 0 else 0,
        )
        with starting_workers():
            self._iterator = iter(loader)
        self._consumed = self.sampler.batches_drawn
        if workers > 0:
            _close_at_exit(self)
            self._wrap_sigchld()

    def _wrap_sigchld(self) -> None:
        """torch raises a RuntimeError from its SIGCHLD handler when a worker dies, wherever
        the training process is. Ours turns it into a DataFailure, raised at once only while
        the rank waits for a batch (which would otherwise wait for the dead worker); anywhere
        else (the model's step, a checkpoint's write, an error's own handling) it is kept
        and raised at the next batch, so it never cuts code that must finish, nor replaces
        an error already on its way out with a bare one."""
        if threading.current_thread() is not threading.main_thread():
            return
        torch_handler = signal.getsignal(signal.SIGCHLD)
        if not callable(torch_handler) or self._sigchld is not None:
            return

        def handler(signum: int, frame: Any) -> None:
            try:
                torch_handler(signum, frame)
            except RuntimeError as exc:
                death = self._failure(exc, self.sampler.batches_drawn + 1)
                if self._waiting:
                    raise death from None
                self._death = death

        self._sigchld = (torch_handler, handler)
        signal.signal(signal.SIGCHLD, handler)

    def _failure(self, what: LoadFailure | Exception, update: int) -> DataFailure:
        where = f"rank {self.rank}, update {update}"
        if isinstance(what, LoadFailure):
            subject = (f"loading example {what.key[0]} failed ({where}): {what.message}"
                       if what.key is not None else f"loading a batch failed ({where}): "
                       f"{what.message}")
        else:
            first = str(what).strip().splitlines()[0] if str(what).strip() else ""
            died = "worker" in first and ("killed" in first or "exited" in first)
            if died:
                subject = f"a data worker process died ({where}): {first}"
            # A worker killed while it sends a batch breaks the transfer before torch's own
            # checks see the death: the rank then reads ConnectionResetError or EOFError.
            elif (isinstance(what, (ConnectionError, EOFError))
                  and (dead := self._dead_workers())):
                subject = (f"a data worker process died ({where}): DataLoader worker (pid(s) "
                           f"{', '.join(map(str, dead))}) exited unexpectedly, breaking off "
                           f"the batch it sent ({type(what).__name__})")
            elif first.startswith("DataLoader timed out"):
                subject = (f"a data worker hangs ({where}): no batch came within "
                           f"{self.worker_timeout_s:g} s (half of trainer.collective_timeout); "
                           "it is stuck in the dataset's __getitem__ or in what that calls")
            else:
                subject = f"loading a batch failed ({where}): {type(what).__name__}: {first}"
        return DataFailure(subject)

    def _dead_workers(self, wait_s: float = 1.0) -> list[int]:
        """Pids of this loader's worker processes that have ended (waiting up to `wait_s`
        for the exit of one whose connection already broke)."""
        workers = list(getattr(self._iterator, "_workers", ()))
        deadline = time.monotonic() + wait_s
        while True:
            dead = [w.pid for w in workers if w.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def close(self) -> None:
        """Stop the worker processes (prefetched batches are dropped, never counted)."""
        if self._sigchld is not None:
            torch_handler, ours = self._sigchld
            self._sigchld = None
            if threading.current_thread() is threading.main_thread() and \
                    signal.getsignal(signal.SIGCHLD) is ours:
                signal.signal(signal.SIGCHLD, torch_handler)
        _OPEN.discard(self)
        iterator, self._iterator = self._iterator, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()  # now, not whenever the iterator is collected
            end_left_over(getattr(iterator, "_workers", ()))


_OPEN: weakref.WeakSet[BatchLoader] = weakref.WeakSet()  # loaders whose workers may live
_EXIT_HOOK = False  # whether _close_open_loaders is registered


def _close_at_exit(loader: BatchLoader) -> None:
    """Close `loader` at interpreter exit if nothing closed it before: its workers ignore
    SIGTERM, with which Python's own exit ends (and then waits for) its children. Registered
    once workers first start, after torch's and multiprocessing's exit hooks: it runs before
    them (torch's would make the workers' shutdown a no-op)."""
    global _EXIT_HOOK
    if not _EXIT_HOOK:
        atexit.register(_close_open_loaders)
        _EXIT_HOOK = True
    _OPEN.add(loader)


def _close_open_loaders() -> None:
    for loader in list(_OPEN):
        loader.close()



class InTurn(Sequence[Batch]):
    """The K micro-batches of one update under G, each loaded when first read, in order
    (the learner reads each once): one micro-batch resident at a time."""

    def __init__(self, load: Any, count: int) -> None:
        self._load, self._count, self._next = load, count, 0

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k: int) -> Batch:  # type: ignore[override]
        if k != self._next:
            raise IndexError(f"micro-batch {k} read out of turn (next is {self._next})")
        self._next += 1
        return self._load(k, self._next == self._count)

    def finish(self) -> None:
        """Load (and drop) the micro-batches not read, so the next update starts in step."""
        while self._next < self._count:
            self[self._next]
