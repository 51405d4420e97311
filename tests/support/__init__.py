"""Helpers shared by the tests (plain functions; fixtures stay in the conftest.py files).

`tests` is importable from the repository root (pytest's `pythonpath = ["."]`), so a test
imports `from tests.support import run_cli`. Modules: `processes` (paths, CLI, torchrun, a
launch the test holds, a live run), `recipes` (recipe files), `files` (directories,
checkpoint tensors), `state_compare` (strict comparison of saved state), `cli` (the CLI
in-process, throwaway plugins), `recovery` and `data` (the recovery and data tests'
factories and records).
"""

from tests.support.files import snapshot_dir, tensors_by_path
from tests.support.processes import (
    CPU_RECIPE,
    FACTORIES,
    REPO,
    SCRIPTS,
    TESTS,
    TIMEOUT,
    assert_ok,
    child_pids,
    factories_env,
    run_cli,
    run_python_module,
    run_torchrun,
    start_endless_run,
    start_python_module,
    torchrun_workers,
    worker_env,
    workers_output,
)
from tests.support.recipes import RESTART_RECIPE, SHORT_RECIPE, write_recipe

__all__ = ["CPU_RECIPE", "FACTORIES", "REPO", "RESTART_RECIPE", "SCRIPTS", "SHORT_RECIPE",
           "TESTS", "TIMEOUT",
           "assert_ok", "child_pids", "factories_env", "run_cli", "run_python_module",
           "run_torchrun", "snapshot_dir", "start_endless_run", "start_python_module",
           "tensors_by_path", "torchrun_workers", "worker_env", "workers_output",
           "write_recipe"]
