"""`check-data`: load every example of a recipe's data once, before a long run (R-SCALE-2).

A bad frame deep in a dataset (a truncated video, a corrupt PNG) would otherwise stop a run
hours in, at the first batch that draws it. Here every example is loaded once, in index
order, by torch's DataLoader with the recipe's data workers (each example is what training
would decode: only the features the source selects), and every failure is kept with the
message the reader gives it (the LeRobot reader names the episode, the frame and the file).
Examples share frames (windows), so one bad frame fails several examples: the report lists
each distinct message once, with the examples it failed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

CHUNK = 32  # examples per DataLoader batch: progress granularity, and little IPC per batch


@dataclass
class Problem:
    """One distinct failure and the examples (indices) it failed."""

    message: str
    examples: list[int] = field(default_factory=list)


@dataclass
class DataReport:
    checked: int
    problems: list[Problem]

    @property
    def failed(self) -> int:
        return sum(len(p.examples) for p in self.problems)


class _Failures:
    """The dataset as the check's DataLoader sees it: a chunk of indices gives back only
    the failures `(index, message)`, so no example crosses the worker pipe."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> list[tuple[int, str]]:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[int, str]]:
        failures = []
        for index in indices:
            try:
                self.dataset[int(index)]
            except Exception as exc:  # every failure is reported, none stops the check
                failures.append((int(index), f"{type(exc).__name__}: {exc}"))
        return failures


def _flat(batch: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return batch


def check_examples(dataset: Any, *, workers: int = 0,
                   progress: Callable[[int], None] | None = None) -> DataReport:
    """Load every example of `dataset` once; the failures, grouped by message. `progress`
    is called with the number of examples each finished chunk held."""
    import multiprocessing

    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    size = len(dataset)
    fork = workers > 0 and "fork" in multiprocessing.get_all_start_methods()
    loader = DataLoader(_Failures(dataset),
                        batch_sampler=BatchSampler(SequentialSampler(range(size)), CHUNK,
                                                   drop_last=False),
                        num_workers=workers, collate_fn=_flat,
                        multiprocessing_context="fork" if fork else None)
    by_message: dict[str, Problem] = {}
    done = 0
    for failures in loader:
        for index, message in failures:
            by_message.setdefault(message, Problem(message)).examples.append(index)
        chunk = min(CHUNK, size - done)
        done += chunk
        if progress is not None:
            progress(chunk)
    return DataReport(size, list(by_message.values()))
