"""A new run's first weights from earlier ones (`train-sl --init-from`): not a resume.

The source is a checkpoint (plain, or a sharded manifest with its `shards/` beside it) or a
`state_dict` file written by `embodichain export`. Only the model's tensors are taken (the
EMA's with `ema`); the run keeps its own identity, optimizer, schedule and data order.

Rank 0 verifies the file as resume does (memory-mapped: a plain checkpoint's payload digest,
a sharded manifest's digest) and sends every rank a small catalogue: each tensor's name and
global shape, and where its rows lie in the file (or in each shard). Every rank then checks
the catalogue against the factory's model alike (so all refuse alike, exit 2), and loads it
*after* its strategy spread the model and before the EMA copies it (initial_rows.py): each
rank copies only its own rows out of the memory-mapped file(s), as the FSDP re-cut does; a
file that a rank's node lacks is sent, those rows only, by the lowest rank that has it. No
rank holds the full state beyond its own model (a DDP rank's model is whole, an FSDP rank's
its shard). Tensors are matched by name; a shape mismatch is refused unless the tensor is
re-initialised with `--init-skip REGEX`, a tensor missing on either side unless allowed, and
a file that shares no tensor with the model always.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.checkpoint.initial_rows import load_rows, tensors_in
from embodichain.core.errors import CheckpointError, RefusedError, UsageError

SHOWN = 6  # names listed in a message before "... (N more)"


@dataclass(frozen=True)
class InitFrom:
    """What the user asked for: the file, EMA or model weights, what may not match, and the
    tensors to leave at the model's own initialisation (`skip`: regular expressions)."""

    path: Path
    ema: bool = False
    allow_missing: bool = False
    allow_unexpected: bool = False
    skip: tuple[str, ...] = ()


@dataclass
class InitialWeights:
    """What every rank loads (a catalogue, not the tensors) and what run.json records.

    `pieces`: the files that hold the rows, as a sharded manifest's table ({piece: {file,
    cuts: {model: {name: [offset, rows, global rows] | None}}, file_sha256, host}}) beside
    `directory`; `view` says where the tensors sit in each file ("learner.model",
    "learner.ema", "flat", "shard.model", "shard.ema"); `shapes` each tensor's global shape.
    """

    record: dict[str, Any]
    directory: str
    pieces: dict[int, dict[str, Any]]
    view: str
    shapes: dict[str, tuple[int, ...]]
    spec: InitFrom
    loaded: bool = field(default=False, compare=False)


def read(spec: InitFrom) -> InitialWeights:
    """The catalogue of the weights `spec` names, verified (raises UsageError naming the
    file, exit 2). Nothing is kept in memory: tensors are only memory-mapped."""
    from embodichain.core.checkpoint.file import read_checkpoint
    from embodichain.core.checkpoint.formats import format_of
    from embodichain.core.file_hash import file_sha256

    path = Path(spec.path)
    if path.is_dir():
        raise UsageError(f"--init-from {path} is a directory; name a checkpoint file in it "
                         "(e.g. last.pt or step_N.pt) or an exported state_dict")
    if not path.is_file():
        raise UsageError(f"--init-from {path}: no such checkpoint or state_dict file")
    _check_patterns(spec.skip)
    sha = file_sha256(path)
    record: dict[str, Any] = {"path": str(path.resolve()), "run_id": None, "step": None,
                              "ema": spec.ema, "kind": "export", "sha256": sha}
    try:
        data = read_checkpoint(path, mmap=True)
    except CheckpointError as exc:
        if "no manifest" not in str(exc):  # corrupt, unsafe, another version: as resume says
            raise
        return _exported(path, spec, record)
    run = data["payload"].get("run", {})
    record.update(run_id=run.get("run_id"), step=int(data["manifest"]["step"]))
    fmt = format_of(data)
    if fmt.keeps_parts:
        record["kind"] = "sharded checkpoint"
        return _sharded(path, data, fmt.parts(data), spec, record)
    record["kind"] = "checkpoint"
    view = "learner.ema" if spec.ema else "learner.model"
    tensors = tensors_in(data, view)
    if tensors is None:
        raise UsageError(f"--init-from-ema: {path} holds no EMA weights (the run had no "
                         "trainer.ema when it wrote this checkpoint); drop --init-from-ema for "
                         "the model's own weights")
    return _whole_file(path, tensors, view, spec, record)


def _exported(path: Path, spec: InitFrom, record: dict[str, Any]) -> InitialWeights:
    """An export's state_dict: a flat mapping of names to tensors, loaded weights-only."""
    if spec.ema:
        raise UsageError(f"--init-from-ema: {path} is an exported state_dict, which holds one "
                         "set of weights (export --ema wrote the EMA's); drop --init-from-ema")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # not a torch file at all, or one needing arbitrary unpickling
        raise UsageError(f"--init-from {path} is not an embodichain checkpoint nor a torch "
                         f"file of tensors ({type(exc).__name__}: {str(exc).splitlines()[0]})"
                         ) from None
    if not (isinstance(state, Mapping) and state
            and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                    for k, v in state.items())):
        raise UsageError(f"--init-from {path} is neither an embodichain checkpoint nor a "
                         "state_dict of tensors (as `embodichain export` writes)")
    return _whole_file(path, state, "flat", spec, record)


def _whole_file(path: Path, tensors: Mapping[str, torch.Tensor], view: str, spec: InitFrom,
                record: dict[str, Any]) -> InitialWeights:
    """One file holding every tensor whole: one piece whose cuts are all of each tensor."""
    cuts = {n: [0, _rows(t.shape), _rows(t.shape)] for n, t in tensors.items()}
    piece = {"file": path.name, "cuts": {"model": cuts, "optimizer": {}},
             "file_sha256": record["sha256"], "host": socket.gethostname()}
    return InitialWeights(record, str(path.parent), {0: piece}, view,
                          {n: tuple(t.shape) for n, t in tensors.items()}, spec)


def _sharded(path: Path, data: Mapping[str, Any], table: Mapping[int, dict[str, Any]],
             spec: InitFrom, record: dict[str, Any]) -> InitialWeights:
    """A sharded manifest: its shard `table` (the format's parts), with where each shard's
    rows lie."""
    from embodichain.core.checkpoint.recut import recut_refusal

    refusal = recut_refusal(data["payload"])
    if refusal is not None:
        raise UsageError(f"--init-from {path}: {refusal}; write its weights with `embodichain "
                         "export` and start from that file")
    if spec.ema and not table[0]["cuts"]["ema"]:
        raise UsageError(f"--init-from-ema: {path} holds no EMA weights (the run had no "
                         "trainer.ema); drop --init-from-ema for the model's own weights")
    first = path.parent / table[0]["file"]
    if not first.is_file():
        raise UsageError(f"--init-from {path}: the shard of rank 0 is missing: {first} "
                         f"(written on host {table[0].get('host')}); rank 0 reads the "
                         "tensors' shapes from it")
    shard = torch.load(first, mmap=True, weights_only=True, map_location="cpu")["payload"]
    shapes = {n: tuple(p["global_shape"]) for n, p in shard["placements"].items()}
    pieces = {}
    for k, entry in table.items():
        cuts = {}
        for name, cut in entry["cuts"]["model"].items():
            whole = [0, _rows(shapes[name]), _rows(shapes[name])]
            cuts[name] = cut if cut is not None else whole if k == 0 else None
        pieces[k] = {**entry, "cuts": {"model": cuts, "optimizer": {}}}
    return InitialWeights(record, str(path.parent), pieces,
                          "shard.ema" if spec.ema else "shard.model", shapes, spec)


def _rows(shape: Sequence[int]) -> int:
    """Rows of a tensor of `shape`: a 0-dim tensor is read as one row of one value."""
    return int(shape[0]) if len(shape) else 1


def _check_patterns(patterns: Sequence[str]) -> None:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"--init-skip {pattern!r} is not a regular expression: {exc}"
                             ) from None


def agree(spec: InitFrom, needed: Callable[[], bool] = lambda: True) -> InitialWeights | None:
    """On every rank: rank 0 reads `spec`'s catalogue (only when `needed()`, asked on rank
    0: a `--resume auto` that continues its run reads no initial weights) and every rank
    receives it, or every rank raises rank 0's refusal (RefusedError, exit 2)."""
    from embodichain.core.distributed import process_group

    outcome: dict[str, Any] | None = None
    if process_group.is_rank_zero():
        try:
            outcome = {"weights": read(spec) if needed() else None}
        except UsageError as exc:
            outcome = {"refused": str(exc), "origin": process_group.rank_zero_origin()}
    outcome = process_group.broadcast_from_rank_zero(outcome)
    if "refused" in outcome:
        process_group.wait_for_rank_zero_exit(outcome["origin"])
        raise RefusedError(outcome["refused"])
    return outcome["weights"]


# ----------------------------------------------------------------------------------------
# The hook: the factory's model takes the weights once its strategy has spread it

_PENDING: list[InitialWeights] = []


@contextlib.contextmanager
def pending(weights: InitialWeights | None) -> Iterator[None]:
    """While the factory runs: the first Learner it builds loads `weights` (None: nothing).
    Refuses (UsageError) a factory that built no Learner with them."""
    if weights is None:
        yield
        return
    _PENDING.append(weights)
    try:
        yield
    finally:
        _PENDING.remove(weights)
    if not weights.loaded:
        raise UsageError("--init-from: the factory built no model to load the weights into")


def load_pending(model: nn.Module) -> None:
    """Called by the Learner with the factory's model once its strategy has spread it (and
    before the EMA copies it), on every rank: load the pending weights once (collective; a
    no-op when none are pending)."""
    if _PENDING and not _PENDING[-1].loaded:
        load_into(model, _PENDING[-1])
        _PENDING[-1].loaded = True


@dataclass(frozen=True)
class Match:
    """How the file's tensors meet the model's, by name (the same on every rank)."""

    loaded: list[str]
    skipped: list[str]  # the model's, left at its initialisation by --init-skip
    missing: list[str]  # the model's, absent from the file
    unexpected: list[str]  # the file's, absent from the model
    mismatched: list[str]  # described: name, both shapes


class WeightsDoNotFit(UsageError):
    """The file's tensors do not fit the model; `found` says which, for a caller (such as
    eval, which gave no --init-from) that words the refusal its own way."""

    def __init__(self, message: str, found: Match) -> None:
        super().__init__(message)
        self.found = found


def match(own: Mapping[str, tuple[int, ...]], weights: InitialWeights) -> Match:
    """Compare the model's tensors (name -> global shape) with the file's."""
    spec, source, where = weights.spec, weights.shapes, weights.record["path"]
    skipped = sorted(n for n in own if any(re.search(p, n) for p in spec.skip))
    unused = [p for p in spec.skip if not any(re.search(p, n) for n in [*own, *source])]
    if unused:
        raise UsageError(f"--init-skip {unused[0]!r} matches no tensor of the model or of "
                         f"{where}; the model's: {_names(sorted(own))}")
    skipping = set(skipped) | {n for n in source if any(re.search(p, n) for p in spec.skip)}
    common = [n for n in own if n in source and n not in skipping]
    return Match(
        loaded=[n for n in common if tuple(source[n]) == tuple(own[n])],
        skipped=skipped,
        missing=sorted(n for n in own if n not in source and n not in skipping),
        unexpected=sorted(n for n in source if n not in own and n not in skipping),
        mismatched=[f"{n}: {tuple(source[n])} in {where}, {tuple(own[n])} in the model"
                    for n in common if tuple(source[n]) != tuple(own[n])])


def load_into(model: nn.Module, weights: InitialWeights) -> None:
    """Copy the file's tensors into `model` by name (each rank its own rows), refusing
    (UsageError) every shape mismatch not skipped, tensors missing on either side unless
    allowed, and a file that shares no tensor with the model, before changing anything."""
    from embodichain.core.distributed import process_group

    spec, where = weights.spec, weights.record["path"]
    own = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    found = match(own, weights)
    problems = [f"shape mismatch: {m} (re-initialise it with --init-skip REGEX)"
                for m in found.mismatched]
    if found.missing and not spec.allow_missing:
        problems.append(f"missing from {where} ({len(found.missing)}; the model's own "
                        f"initialisation would stay; allow with --init-allow-missing): "
                        + _names(found.missing))
    if found.unexpected and not spec.allow_unexpected:
        problems.append(f"not in the model ({len(found.unexpected)}; they would be dropped; "
                        "allow with --init-allow-unexpected): " + _names(found.unexpected))
    if not found.loaded and not problems:
        problems.append(f"it shares no tensor with the model: nothing would be loaded (the "
                        f"file's {len(weights.shapes)}: {_names(sorted(weights.shapes))}; the "
                        f"model's {len(own)}: {_names(sorted(own))}). Is it the checkpoint "
                        "of another model? Without --init-from the run starts from its seed")
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise WeightsDoNotFit(f"--init-from {where}: its tensors do not match the model's\n"
                              f"{listed}\nNothing was started.", found)
    load_rows(model, found.loaded, directory=weights.directory, pieces=weights.pieces,
              view=weights.view, where=where)
    if process_group.is_rank_zero():
        logging.getLogger("embodichain").info("%s", summary(found, weights))


def summary(found: Match, weights: InitialWeights) -> str:
    """What was loaded and what was left at the model's initialisation, names shortened."""
    total = len(found.loaded) + len(found.skipped) + len(found.missing)
    lines = [f"--init-from {weights.record['path']}: loaded {len(found.loaded)} of the "
             f"model's {total} tensors ({_names(found.loaded)})"]
    kept = [*(f"{n} (--init-skip)" for n in found.skipped), *found.missing]
    if kept:
        lines.append(f"  left at the model's initialisation: {len(kept)} ({_names(kept)})")
    if found.unexpected:
        lines.append(f"  not in the model, dropped: {len(found.unexpected)} "
                     f"({_names(found.unexpected)})")
    return "\n".join(lines)


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else "")
