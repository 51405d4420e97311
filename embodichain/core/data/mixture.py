"""Weighted mixtures of datasets, sampled by the framework's sampler (R-SCALE-3).

A source made of parts (several datasets concatenated: part i holds the indices
`[offset_i, offset_i + size_i)`) says so with a `Parts` description, its `parts` attribute
(`MixtureSource` is a `DatasetSource` with one). The trainer's sampler then draws by weight
instead of uniformly; a source without `parts` samples exactly as before.

- With replacement: each position draws part i with probability w_i / Σw, then one of its
  examples uniformly. Without `trainer.global_batch_size` the draw of a rank's update is a
  function of (seed, update, rank) and the position in it; under G of (seed, update) and the
  global position (a `GlobalDraw`), so every world size draws the same examples.
- `sampling: epochs`: an epoch has as many examples as the whole corpus, N = Σ size_i, of
  which part i gives n_i = N·w_i/Σw (rounded by largest remainder so that Σ n_i = N).
  With n_i = k·size_i + r (0 ≤ r < size_i), every example of the part comes k times in the
  epoch (k whole seeded permutations: up-sampling) and r more from a running sequence of
  the part's seeded permutations, epoch e taking the r after those of epochs 0..e-1 (so a
  down-sampled part, k = 0, shows all its examples once before any twice across epochs,
  and over many epochs every example comes equally often). The epoch's N examples are
  then shuffled by the epoch's permutation and dealt out as in the uniform case.

Every draw is stateless in the update, so a sampler's state is still its position and the
loader's guarantees (any worker count, exact resume) hold unchanged.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from embodichain.core.data.dataset_source import DatasetSource, MapDataset
from embodichain.core.data.global_order import EpochDraw, GlobalOrderSampler
from embodichain.core.data.samplers import EpochSampler, epoch_permutation
from embodichain.core.errors import DataFormatError


def _seed(*parts: object) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Parts:
    """The parts of a source, in index order: names, sizes (examples) and weights."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.sizes) == len(self.weights)) or not self.names:
            raise ValueError("a mixture needs one name, size and weight per part, and a part")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"mixture part names must differ: {list(self.names)}")
        for name, size, weight in zip(self.names, self.sizes, self.weights, strict=True):
            if int(size) <= 0:
                raise ValueError(f"mixture part {name!r} is empty")
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"mixture part {name!r}: weight {weight} is not a positive "
                                 "number")

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The first index of each part."""
        out, at = [], 0
        for size in self.sizes:
            out.append(at)
            at += size
        return tuple(out)

    def part_of(self, indices: torch.Tensor) -> torch.Tensor:
        """The part of each index."""
        ends = torch.tensor(self.offsets[1:], dtype=torch.int64)
        return torch.bucketize(indices.to(torch.int64), ends, right=True)

    def counts(self, indices: torch.Tensor) -> list[int]:
        """How many of `indices` fall in each part."""
        return torch.bincount(self.part_of(indices), minlength=len(self.sizes)).tolist()

    def draw(self, generator: torch.Generator, n: int) -> torch.Tensor:
        """`n` indices with replacement: part i with probability w_i / Σw, then uniform."""
        weights = torch.tensor(self.weights, dtype=torch.float64)
        part = torch.multinomial(weights, n, replacement=True, generator=generator)
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        sizes = torch.tensor(self.sizes, dtype=torch.int64)[part]
        local = torch.minimum((u * sizes).to(torch.int64), sizes - 1)
        return torch.tensor(self.offsets, dtype=torch.int64)[part] + local

    def epoch_counts(self) -> list[int]:
        """n_i: part i's examples in each epoch, N·w_i/Σw by largest remainder (Σ = N)."""
        total, weight = self.total, sum(self.weights)
        exact = [total * w / weight for w in self.weights]
        counts = [math.floor(x) for x in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: (counts[i] - exact[i], i))
        for i in by_remainder[:total - sum(counts)]:
            counts[i] += 1
        return counts

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """Epoch `epoch`'s N indices, in order (see the module docstring)."""
        chosen = []
        for i, (n, size, offset) in enumerate(zip(self.epoch_counts(), self.sizes,
                                                   self.offsets, strict=True)):
            whole, rest = divmod(n, size)
            pieces = [_permutation(size, seed, i, f"epoch-{epoch}-{k}") for k in range(whole)]
            start, end = epoch * rest, (epoch + 1) * rest  # the rest: a running sequence
            for cycle in range(start // size, -(-end // size)):
                lo, hi = max(start - cycle * size, 0), min(end - cycle * size, size)
                pieces.append(_permutation(size, seed, i, f"cycle-{cycle}")[lo:hi])
            if pieces:
                chosen.append(torch.cat(pieces) + offset)
        order = torch.cat(chosen)
        return order[epoch_permutation(seed, epoch, len(order))]


def _permutation(size: int, seed: int, part: int, label: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_seed("embodichain-mixture", seed, part, label))
    return torch.randperm(size, generator=generator)


def parts_of(source: object) -> Parts | None:
    """The source's `Parts`, or None for a source that is not a mixture."""
    parts = getattr(source, "parts", None)
    return parts if isinstance(parts, Parts) else None


class MixtureSource(DatasetSource):
    """A `DatasetSource` whose examples come in parts (`parts`), sampled by weight. Parts
    whose examples would not batch together are refused when it is made
    (`check_parts_batch`)."""

    def __init__(self, dataset: MapDataset, identity: str, parts: Parts) -> None:
        super().__init__(dataset, identity)
        if parts.total != len(self):
            raise ValueError(f"the mixture's parts hold {parts.total} examples, its dataset "
                             f"{len(self)}")
        check_parts_batch(parts.names, [dataset[offset] for offset in parts.offsets])
        self.parts = parts


def check_parts_batch(names: Sequence[str], examples: Sequence[Mapping[str, Any]], *,
                      labels: Sequence[str] | None = None,
                      missing_hint: Callable[[str], str] = lambda key: "") -> None:
    """Refuse parts whose examples would not stack into one batch, comparing each part's
    first example with the first part's, key by key: a key one part lacks, another shape or
    another dtype (a float64 action beside a float32 one would stop the run at the first
    batch mixing them, mid-way). A DataFormatError (exit 2) naming the key, both parts (as
    `labels` describe them; default their names) and what each has; `missing_hint(key)`
    ends the message about a missing key (how to map one)."""
    label = dict(zip(names, labels or [repr(n) for n in names], strict=True))
    first = _tensors(examples[0])
    for name, example in zip(names[1:], examples[1:], strict=True):
        other = _tensors(example)
        odd = [k for k in first if k not in other] + [k for k in other if k not in first]
        for key in odd[:1]:  # a key of the first part's it lacks, else one of its own
            has, lacks = (names[0], name) if key in first else (name, names[0])
            raise DataFormatError(f"mixture part {label[lacks]} has no {key!r}, which part "
                                  f"{label[has]} has{missing_hint(key)}")
        for key, a in first.items():
            b = other[key]
            if a.shape != b.shape or a.dtype != b.dtype:
                raise DataFormatError(
                    f"mixture parts {label[names[0]]} and {label[name]} would not batch: "
                    f"{key!r} is {_described(a)} in {names[0]!r} and {_described(b)} in "
                    f"{name!r}")


def _tensors(example: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}


def _described(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


# --- samplers (the weighted counterparts of samplers.py and global_order.py) -------------


class WeightedReplacementSampler:
    """Without G: update u of rank r draws its `batch_size` indices from a generator seeded
    by (seed, rank, u); the state is the number of updates drawn."""

    def __init__(self, parts: Parts, batch_size: int, seed: int, rank: int) -> None:
        self.parts, self.batch_size, self.seed, self.rank = parts, batch_size, seed, rank
        self.corpus_size = parts.total
        self.batches_drawn = 0

    def indices_of(self, update: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(
            _seed("embodichain-mixture-draw", self.seed, self.rank, update))
        return self.parts.draw(generator, self.batch_size)

    def next_indices(self) -> torch.Tensor:
        update, self.batches_drawn = self.batches_drawn, self.batches_drawn + 1
        return self.indices_of(update)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "mixture", "batches_drawn": self.batches_drawn,
                "corpus_size": self.corpus_size, "batch_size": self.batch_size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") != "mixture":
            raise ValueError("the checkpoint's sampler state is not that of a mixture")
        self.batches_drawn = int(state["batches_drawn"])


class WeightedEpochSampler(EpochSampler):
    """`sampling: epochs` without G over the weighted epoch order of `Parts.epoch_order`."""

    def __init__(self, parts: Parts, batch_size: int, seed: int, rank: int,
                 world_size: int) -> None:
        super().__init__(parts.total, batch_size, seed, rank, world_size)
        self.parts = parts

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._permutation is None or self._permutation[0] != epoch:
            self._permutation = (epoch, self.parts.epoch_order(self.seed, epoch))
        return self._permutation[1]

    def indices_of(self, update: int) -> torch.Tensor:
        epoch, batch = divmod(update, self.batches_per_epoch)
        start = (batch * self.world_size + self.rank) * self.batch_size
        return self.permutation(epoch)[start:start + self.batch_size]


class WeightedReplacementDraw:
    """Under G: update u's G indices from a generator seeded by (seed, u) (a `GlobalDraw`)."""

    def __init__(self, parts: Parts, global_batch_size: int, seed: int) -> None:
        self.parts, self.global_batch_size, self.seed = parts, global_batch_size, seed
        self.corpus_size = parts.total

    def __call__(self, update: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(
            _seed("embodichain-mixture-global-draw", self.seed, update))
        return self.parts.draw(generator, self.global_batch_size)


class WeightedEpochDraw(EpochDraw):
    """Under G, `sampling: epochs`: the next G of the weighted epoch order."""

    def __init__(self, parts: Parts, global_batch_size: int, seed: int) -> None:
        super().__init__(parts.total, global_batch_size, seed)
        self.parts = parts

    def epoch_order(self, epoch: int) -> torch.Tensor:
        return self.parts.epoch_order(self.seed, epoch)


class MixtureGlobalSampler(GlobalOrderSampler):
    """This rank's slice of a weighted global draw."""

    def __init__(self, parts: Parts, draw: Any, rank: int, world_size: int) -> None:
        super().__init__(draw, rank, world_size)
        self.parts = parts

    def indices_of(self, update: int) -> torch.Tensor:
        return self.draw(update)[self.first_position:self.first_position + self.share]


def mixture_sampler(parts: Parts, sampling: str, batch_size: int, seed: int, rank: int,
                    world_size: int) -> Any:
    """The weighted sampler of `trainer.sampling` without G, for this rank."""
    if sampling == "epochs":
        return WeightedEpochSampler(parts, batch_size, seed, rank, world_size)
    return WeightedReplacementSampler(parts, batch_size, seed, rank)


def mixture_global_sampler(parts: Parts, sampling: str, global_batch_size: int, seed: int,
                           rank: int, world_size: int) -> MixtureGlobalSampler:
    """The weighted sampler of `trainer.sampling` under G, for this rank."""
    draw = (WeightedEpochDraw if sampling == "epochs" else WeightedReplacementDraw)(
        parts, global_batch_size, seed)
    return MixtureGlobalSampler(parts, draw, rank, world_size)


def part_counts(sampler: Any, update: int) -> Sequence[float]:
    """This rank's examples of each part in `update` (empty for a sampler without parts)."""
    parts = getattr(sampler, "parts", None)
    if not isinstance(parts, Parts):
        return ()
    return [float(c) for c in parts.counts(sampler.indices_of(update))]


def part_metrics(sampler: Any, summed: Sequence[float]) -> dict[str, float]:
    """`train/examples/<part>`: each part's examples in the update, summed over ranks."""
    parts = getattr(sampler, "parts", None)
    if not isinstance(parts, Parts) or len(summed) != len(parts.names):
        return {}
    return {f"train/examples/{name}": float(c)
            for name, c in zip(parts.names, summed, strict=True)}
