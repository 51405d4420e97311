"""Expensive fixture results built once per test run, also under pytest-xdist (where every
worker is a pytest session of its own and would otherwise train each shared run again)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Any]) -> Any:
    """`build(root)` run once per test run into `root`, a directory every worker of the run
    sees; the first caller builds it under a lock, later ones (other workers included) wait
    for it and get the same result. `build` returns JSON (paths as strings)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's directory, holding each worker's own base
    root = base / f"shared-{name}"
    result = root / ".built.json"
    with open(base / f"shared-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            return json.loads(result.read_text())
        if root.exists():  # an earlier build raised: what it left is no result
            shutil.rmtree(root)
        root.mkdir()
        value = build(root)
        result.write_text(json.dumps(value))
        return value
