"""What a factory derived from its data to build its model (a dataset's statistics, a
camera's image size), recorded in every checkpoint, so that the model is rebuilt to act
(`eval`, `export --policy`) from the checkpoint alone, the data gone (design R-EVAL-5).

The factory gives them to its trainer (`SupervisedTrainer(model_facts=...)`: JSON values),
which writes them into each checkpoint's run record. When the framework rebuilds a
checkpoint's model only to act, it opens `rebuilding_to_act(recorded)` around the factory:
`facts_from_checkpoint()` then returns the record, so the factory reads no data and gives
`source=None`; the weights (the statistics a model keeps as buffers among them) are loaded
from the checkpoint afterwards. A checkpoint written before the record existed has none:
the factory reads its data as before.

    facts = facts_from_checkpoint()
    data = None if facts is not None else read_data(config)
    facts = facts if facts is not None else {"stats": data.stats, "size": data.size}
    model = Policy(**facts)
    return SupervisedTrainer(config, model=model, source=data.source if data else None,
                             model_facts=facts, ...)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from embodichain.core.errors import UsageError

RUN_KEY = "model_facts"
"""The checkpoint run record's entry (`payload["run"]["model_facts"]`)."""
DEMONSTRATION_SEEDS = "demonstration_seeds"
"""The run record's entry of the environment seeds the training data was recorded with."""
DEMONSTRATION_SEEDS_UNKNOWN = "demonstration_seeds_unknown"
"""The run record's entry saying why those seeds are unknown (the file that would say)."""


@dataclass(frozen=True)
class UnknownSeeds:
    """`SupervisedTrainer(demonstration_seeds=UnknownSeeds(why))`: the data are
    demonstrations recorded with environment seeds that cannot be told, `why` naming the
    file that would hold them. Evaluations then warn that their seeds are unchecked, and
    record it (a missing file never disables the check in silence)."""

    why: str

_REBUILDING: contextvars.ContextVar[tuple[dict[str, Any] | None] | None] = \
    contextvars.ContextVar("embodichain_rebuilding_to_act", default=None)


@contextlib.contextmanager
def rebuilding_to_act(recorded: Mapping[str, Any] | None) -> Iterator[None]:
    """The factory called inside builds a checkpoint's model only to act: `recorded` is the
    checkpoint's facts (None: it recorded none)."""
    token = _REBUILDING.set((dict(recorded) if recorded is not None else None,))
    try:
        yield
    finally:
        _REBUILDING.reset(token)


def facts_from_checkpoint() -> dict[str, Any] | None:
    """Inside a factory: the facts the checkpoint being rebuilt to act recorded (`eval`,
    `export --policy`); None while training (read them from the data) or when the
    checkpoint recorded none."""
    scope = _REBUILDING.get()
    return None if scope is None else scope[0]


def only_acting() -> bool:
    """Whether the recipe now validated, and the factory now running, rebuild a checkpoint's
    model only to act: no data is read (a schema's check that a dataset exists passes), its
    trainer takes no sampler or loader and will never train."""
    return _REBUILDING.get() is not None


def recorded(facts: Mapping[str, Any] | None, factory: str) -> dict[str, Any] | None:
    """The factory's facts as they are written into checkpoints: JSON values (numpy arrays
    and scalars as lists and numbers); UsageError naming what cannot be written."""
    if facts is None:
        return None
    if not isinstance(facts, Mapping):
        raise UsageError(f"factory {factory!r}: model_facts must be a mapping, got "
                         f"{type(facts).__name__}")
    try:
        return json.loads(json.dumps(dict(facts), default=_plain))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"factory {factory!r}: model_facts must be JSON values (numbers, "
                         f"strings, lists, mappings; numpy arrays): {exc}") from None


def run_record(payload_run: Mapping[str, Any]) -> dict[str, Any] | None:
    """The facts a checkpoint's run record holds (None: written before they were kept)."""
    facts = payload_run.get(RUN_KEY)
    return dict(facts) if isinstance(facts, Mapping) else None


def demonstration_seeds(payload_run: Mapping[str, Any]) -> list[int]:
    """The demonstration seeds a checkpoint's run record holds (none: [])."""
    return [int(s) for s in payload_run.get(DEMONSTRATION_SEEDS) or []]


def unknown_seeds(record: Mapping[str, Any]) -> str | None:
    """Why a run record's (or an artifact's provenance's) demonstration seeds are unknown;
    None where they are known or there are none."""
    why = record.get(DEMONSTRATION_SEEDS_UNKNOWN)
    return str(why) if why else None


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy arrays and scalars, torch tensors
    if callable(tolist):
        return tolist()
    raise TypeError(f"{type(value).__name__} is not a JSON value")
