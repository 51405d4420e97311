"""Guards around careless input that need no table row: the checkpoint plan warning, an
unwritable output_dir (as root, chmod stops nothing: the errno is simulated), the
validate-config warnings and unwrapped digests in piped inspect output (issue 12)."""

from __future__ import annotations

import errno
import re
import shutil
from pathlib import Path

import pytest

from embodichain.core.checkpoint import disk_plan
from embodichain.core.errors import RefusedError
from embodichain.core.runs.run_dir import claim
from embodichain.core.runs.run_lock import RunLock
from tests.support import CPU_RECIPE, run_cli, worker_env, write_recipe
from tests.support.cli import invoke


def plan(**changes: object) -> str | None:
    args = {"max_updates": 200, "step": 0, "save_every": 100, "keep_last": None,
            "directory": Path("/tmp"), "checkpoint_bytes": 10_000, **changes}
    return disk_plan.checkpoint_plan_warning(**args)


def test_checkpoint_plan_warning() -> None:
    assert plan() is None and plan(save_every=0, max_updates=10**18) is None
    huge = plan(max_updates=10**18)
    assert huge is not None and "10,000,000,000,000,000 step files" in huge
    assert "trainer.keep_last" in huge
    assert plan(max_updates=10**18, keep_last=5) is None  # retention bounds it
    assert plan(max_updates=100_000, save_every=100) is None  # exactly 1,000 files
    assert "1,001 step files" in (plan(max_updates=100_100, save_every=100) or "")
    assert plan(max_updates=100_100, step=100_000, save_every=100) is None  # resumed near the end


def test_checkpoint_plan_warning_for_free_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage("/tmp")._replace(free=50_000)
    monkeypatch.setattr(disk_plan.shutil, "disk_usage", lambda path: usage)
    warning = plan(max_updates=1000, save_every=100)  # 11 files of 10 kB > 50 kB
    assert warning is not None and "more than the 50.0 KB free" in warning
    assert "trainer.keep_last" in warning
    assert plan(max_updates=1000, save_every=100, keep_last=2) is None


def test_the_warning_is_printed_at_start(tmp_path: Path) -> None:
    """End to end: a diverging run stops at once (on_nonfinite), after warning at start."""
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **{
        "optimizer.name": "sgd", "optimizer.lr": 1.0e6, "trainer.max_updates": 10**18})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 1
    assert re.search(r"warning: trainer.save_every: 100 with trainer.max_updates: "
                     r"1000000000000000000 plans 10,000,000,000,000,000 step files", proc.stderr)


@pytest.mark.parametrize("where", ["claim", "lock"])
def test_an_unwritable_output_dir_is_refused(where: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "ro" / "run"

    def denied(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(RefusedError) as caught:
        if where == "claim":
            claim(directory, {"run_id": "x"})
        else:
            RunLock(directory).acquire()
    message = str(caught.value)
    assert f"trainer.output_dir {directory} cannot be used: Permission denied" in message
    assert ".tmp" not in message and ".lock" not in message
    assert not (tmp_path / "ro").exists()


def test_validate_config_warns_about_the_output_dir(tmp_path: Path) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "run.json").write_text("{}")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for output_dir, expected in ((used, "already holds a run (run.json)"),
                                 (a_file, "exists and is not a directory"),
                                 (a_file / "run", f"cannot be created: {a_file} is a file")):
        result = invoke("validate-config", str(CPU_RECIPE),
                        "--set", f"trainer.output_dir={output_dir}")
        assert result.exit_code == 0, result.output  # the recipe is valid
        assert f"warning: trainer.output_dir {output_dir}" in result.stderr
        assert expected in result.stderr
    fine = invoke("validate-config", str(CPU_RECIPE),
                  "--set", f"trainer.output_dir={tmp_path / 'new'}")
    assert fine.exit_code == 0 and "warning" not in fine.stderr
    assert not (tmp_path / "new").exists()


def test_piped_inspect_output_never_wraps_digests(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "a-rather-long-run-directory-name"
                          / "with-more" / "run", **{"trainer.max_updates": 2,
                                                    "trainer.save_every": 2})
    assert run_cli("train-sl", "--config", str(recipe), "--no-progress").returncode == 0
    checkpoint = tmp_path / "a-rather-long-run-directory-name" / "with-more" / "run" / "step_2.pt"
    proc = run_cli("inspect-checkpoint", str(checkpoint), env=worker_env(COLUMNS="80"))
    assert proc.returncode == 0, proc.stderr
    digests = re.findall(r"\b[0-9a-f]{64}\b", proc.stdout)
    assert len(digests) >= 2, proc.stdout  # payload and config digests, each whole on a line
    assert str(checkpoint) in proc.stdout
