"""A save that fails because the disk is full says so: the bytes needed, the bytes free and
the file (issue: `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos
13504 vs 13398`). The disk is a real one, a 64 KiB tmpfs in a mount namespace of the
training process's own, so nothing else fills up and nothing is left mounted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, worker_env, write_recipe


def _namespace() -> list[str]:
    """`unshare` into a mount namespace of its own (a user namespace too when not root)."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]


def test_a_full_disk_is_named_with_the_bytes_needed_and_free(tmp_path: Path) -> None:
    """Catches torch's `unexpected pos` message reaching the user for a full disk."""
    disk = tmp_path / "disk"
    disk.mkdir()
    run = disk / "run"
    # hidden 512: an Adam checkpoint of ~45 KB, which the 64 KiB disk cannot hold beside
    # the run's other files once the first one is written
    recipe = write_recipe(tmp_path / "r.yaml", run, **{
        "trainer.max_updates": 4, "trainer.save_every": 2, "trainer.validate_every": 0,
        "trainer.log_every": 1, "model.hidden": 512})
    script = (f"mount -t tmpfs -o size=64k tmpfs {disk} && exec {sys.executable} -m "
              f"embodichain train-sl --config {recipe} --no-progress")
    proc = subprocess.run([*_namespace(), "sh", "-c", script], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 1 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"no tmpfs mount allowed here: {proc.stderr.strip()}")
    assert proc.returncode == 1, proc.stderr
    found = re.search(r"saving checkpoint (\S+) failed on rank 0: the disk is full "
                      r"\(No space left on device\): the checkpoint needs ([\d.]+ [KM]?B), "
                      r"([\d.]+ [KM]?B) are free on the file system of (\S+) \((\S+)\)",
                      proc.stderr)
    assert found, proc.stderr
    assert found.group(1) == found.group(5) and Path(found.group(1)).parent == run
    assert found.group(4) == str(run)
    assert "inline_container" not in proc.stderr and "unexpected pos" not in proc.stderr
