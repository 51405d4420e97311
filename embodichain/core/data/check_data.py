"""`check-data`: load every example of a recipe's data once, before a long run (R-SCALE-2).

A bad frame deep in a dataset (a truncated video, a corrupt PNG) would otherwise stop a run
hours in, at the first batch that draws it. Here every example is loaded once, in index
order, by torch's DataLoader with the recipe's data workers (each example is what training
would decode: only the features the source selects), and every failure is kept with the
message the reader gives it (the LeRobot reader names the episode, the frame and the file).
Examples share frames (windows), so one bad frame fails several examples: the report lists
each distinct message once, with the examples it failed; `by_file_and_episode` then folds
the messages that differ only in their frame (a damaged file fails every frame of an
episode) into one per file and episode, listing the frames.
"""

from __future__ import annotations

import re
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


_FRAME = re.compile(r"\bframe (\d+)\b")
_TIME = re.compile(r"\bt=\d+(?:\.\d+)? s\b")  # a video frame's time, one per frame
SHOWN_FRAMES = 8


def by_file_and_episode(problems: Sequence[Problem]) -> list[Problem]:
    """`problems` with those whose messages differ only in the frame (its number, and its
    time in a video) folded into one: `episode 1, frames 0, 1, 2 (3 frames), <file>`, with
    the union of their examples. Messages that name no frame stay as they are."""
    folded: dict[str, list[tuple[int, Problem]]] = {}
    for problem in problems:
        found = _FRAME.search(problem.message)
        key = problem.message if found is None else \
            _TIME.sub("t=(each frame's)", _FRAME.sub("frame #", problem.message, count=1))
        folded.setdefault(key, []).append((int(found.group(1)) if found else -1, problem))
    out = []
    for key, members in folded.items():
        if len(members) == 1:
            out.append(members[0][1])
            continue
        frames = sorted({frame for frame, _ in members})
        listed = ", ".join(map(str, frames[:SHOWN_FRAMES])) + (
            ", ..." if len(frames) > SHOWN_FRAMES else "")
        message = key.replace("frame #", f"frames {listed} ({len(frames)} frames)", 1)
        out.append(Problem(message, sorted({i for _, p in members for i in p.examples})))
    return out


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
