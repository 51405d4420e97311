"""Helpers shared by the recovery tests (the session runs themselves live in tests/conftest.py)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from conftest import worker_env

from embodichain.core.checkpoint import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.run_dir import read_metrics

HERE = Path(__file__).resolve().parent


def factory_env(**extra: str) -> dict[str, str]:
    """Worker environment in which `recovery_factories:NAME` resolves."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    return worker_env(PYTHONPATH=path, **extra)


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


def assert_training_state_equal(a: Path, b: Path) -> int:
    """Model, optimizer, schedule and every rank's RNG/sampler/buffers equal; returns #tensors."""
    pa, pb = read_checkpoint(a)["payload"], read_checkpoint(b)["payload"]
    assert pa["run"]["step"] == pb["run"]["step"]
    count = assert_state_equal(pa["learner"], pb["learner"], "learner")
    count += assert_state_equal(pa["ranks"], pb["ranks"], "ranks")
    return count


def metrics(directory: Path) -> list[dict[str, Any]]:
    log = read_metrics(directory / "metrics.jsonl")
    assert log.torn is None and not log.bad_lines
    return log.records


def without_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in records]


def run_json(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "run.json").read_text())


def rewrite_checkpoint(src: Path, dst: Path, change) -> Path:
    """A copy of `src` at `dst` whose payload `change(payload)` edited, re-digested."""
    payload = read_checkpoint(src)["payload"]
    change(payload)
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(make_checkpoint(payload), dst)
    return dst
