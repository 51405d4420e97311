"""Helpers shared by the recovery tests (the session runs themselves live in tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
from embodichain.core.runs.measured import is_measured
from embodichain.core.runs.run_dir import read_metrics
from tests.support.processes import TESTS, worker_env
from tests.support.state_compare import assert_state_equal as assert_state_equal
from tests.support.state_compare import (
    assert_training_state_equal as assert_training_state_equal,
)

RECOVERY = TESTS / "recovery"  # the recovery factories, kill points and drivers


def factory_env(**extra: str) -> dict[str, str]:
    """Worker environment in which `recovery_factories:NAME` resolves."""
    return worker_env(PYTHONPATH=str(RECOVERY), **extra)


def metrics(directory: Path) -> list[dict[str, Any]]:
    log = read_metrics(directory / "metrics.jsonl")
    assert log.torn is None and not log.bad_lines
    return log.records


def without_time(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not is_measured(k)} for r in records]


def run_json(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "run.json").read_text())


def rewrite_checkpoint(src: Path, dst: Path, change) -> Path:
    """A copy of `src` at `dst` whose payload `change(payload)` edited, re-digested."""
    payload = read_checkpoint(src)["payload"]
    change(payload)
    dst.parent.mkdir(parents=True, exist_ok=True)
    write_checkpoint(make_checkpoint(payload), dst)
    return dst


def assert_only_torchruns_traceback(out: str) -> None:
    """Workers print one-line errors (design §9); the only traceback is torchrun's own report."""
    tracebacks = out.split("Traceback (most recent call last):")[1:]
    assert len(tracebacks) == 1 and "ChildFailedError" in tracebacks[0], out
    assert out.count("Traceback") == 1, out
