"""Strict comparison of saved training state, shared by every exact-resume test.

Exact recovery (R-RESUME-1, R-CKPT-5) means more than equal tensors: Python's RNG state,
NumPy's `pos`/`has_gauss`/cached value, each sampler's `batches_drawn`, the optimizer's and
scheduler's param groups and counters, and callback state are plain values; a resume that
lost any of them would still have equal tensors for a while. So everything is compared:
tensors bitwise (`torch.equal`, same dtype and shape), all other values by type and value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.runs.run_dir import read_metrics


def assert_state_equal(a: Any, b: Any, where: str = "") -> int:
    """Structural equality; tensors bitwise (`torch.equal`, same dtype and shape).

    Returns the number of tensors compared, so that callers can check it is not vacuous.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{tuple(a.shape)} " \
                                                          f"vs {b.dtype}{tuple(b.shape)}"
        assert torch.equal(a, b), f"{where}: tensors differ"
        return 1
    if isinstance(a, Mapping):
        assert isinstance(b, Mapping), where
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        return sum(assert_state_equal(a[k], b[k], f"{where}.{k}") for k in a)
    if isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        return sum(assert_state_equal(x, y, f"{where}[{i}]") for i, (x, y) in
                   enumerate(zip(a, b, strict=True)))
    if isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
        return 0
    assert a == b and type(a) is type(b), f"{where}: {a!r} vs {b!r}"
    return 0


def assert_payloads_equal(a: Mapping[str, Any], b: Mapping[str, Any], *,
                          callbacks: bool = True) -> int:
    """Two checkpoint payloads hold the same training state; returns the tensors compared.

    Compared: the step and the metrics carried with it, the learner (model, optimizer and
    scheduler state with their param groups, grad scaler), every rank's RNG streams (torch,
    CUDA, Python, NumPy), sampler (generator and `batches_drawn`) and buffers, and, unless
    `callbacks=False` (runs whose recipes add different callbacks), callback state. The run
    identity (run id, times, output directory) is what may differ.
    """
    ra, rb = a["run"], b["run"]
    assert ra["step"] == rb["step"], f"step {ra['step']} vs {rb['step']}"
    assert_state_equal(ra.get("metrics"), rb.get("metrics"), "run.metrics")
    count = assert_state_equal(a["learner"], b["learner"], "learner")
    assert sorted(a["ranks"]) == sorted(b["ranks"]) != [], "ranks"
    for rank in a["ranks"]:
        mine, theirs = a["ranks"][rank], b["ranks"][rank]
        # the parts most easily lost on resume, named so a failure says which
        assert_state_equal(mine["sampler"].get("batches_drawn"),
                           theirs["sampler"].get("batches_drawn"),
                           f"ranks.{rank}.sampler.batches_drawn")
        assert_state_equal(mine["rng"]["python"], theirs["rng"]["python"],
                           f"ranks.{rank}.rng.python")
        count += assert_state_equal(mine, theirs, f"ranks.{rank}")
    if callbacks:
        count += assert_state_equal(a.get("callbacks"), b.get("callbacks"), "callbacks")
    return count


def assert_training_state_equal(a: Path, b: Path, *, callbacks: bool = True) -> int:
    """`assert_payloads_equal` for two checkpoint files (each read and digest-verified)."""
    return assert_payloads_equal(read_checkpoint(a)["payload"], read_checkpoint(b)["payload"],
                                 callbacks=callbacks)


def comparable_records(directory: Path) -> list[dict[str, Any]]:
    """metrics.jsonl of a run without `time/` keys (R-RESUME-1 compares the rest); it must
    read cleanly: no torn or bad line."""
    log = read_metrics(directory / "metrics.jsonl")
    assert log.torn is None and not log.bad_lines
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in log.records]
