"""A LeRobot dataset on a read-only mount (R-SCALE-2): the cart-pole BC recipe trains from it
and nothing is written into it; `validate-config --build` writes nothing into a dataset.

The mount is a read-only bind mount of the dataset over itself in a private mount namespace
(`unshare -m` as root, `unshare -rm` otherwise), so the rest of the machine never sees it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from embodichain_models.data.cartpole.prepare import prepare

from tests.support import assert_ok, run_cli

TIMEOUT = 300


def _unshare() -> list[str] | None:
    """The `unshare` prefix that may bind-mount read-only here, or None."""
    if shutil.which("unshare") is None:
        return None
    for prefix in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run([*prefix, "sh", "-c", "mount --bind / /mnt 2>/dev/null "
                                "|| mount -t tmpfs none /mnt"], capture_output=True)
        if probe.returncode == 0:
            return prefix
    return None


def _listing(root: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino)
            for p in root.rglob("*")}


@pytest.fixture(scope="module")
def bc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny cart-pole dataset and a recipe of 2 updates over it (no closed-loop
    validation worth the name)."""
    root = tmp_path_factory.mktemp("bc_readonly")
    data = prepare(root / "data", episodes=3, seed=0, size=32)
    assert_ok(run_cli("init", "cartpole_bc", str(root / "packaged.yaml"), cwd=root))
    recipe = yaml.safe_load((root / "packaged.yaml").read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update({"batch_size": 4, "max_updates": 2, "save_every": 2,
                              "validate_every": 2, "log_every": 1, "data_workers": 0,
                              "output_dir": str(root / "run")})
    recipe["model"] = {"channels": 4, "hidden": 8}
    recipe["data"].update(root=str(data), val_episodes=1)
    recipe["validation"] = {"max_examples": 4}
    recipe["evaluation"].update(episodes=1, max_steps=5, envs_per_rank=1, videos=0)
    recipe["evaluation"]["env"]["kwargs"] = {"size": 32}
    (root / "r.yaml").write_text(yaml.safe_dump(recipe))
    return root


def _env(cache: Path) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "EMBODICHAIN_CACHE_DIR": str(cache)}
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def test_the_recipe_trains_from_a_read_only_dataset_and_writes_nothing_into_it(
        bc: Path, tmp_path: Path) -> None:
    """Catches digests cached beside the dataset's files (the run died with EROFS on
    `meta/info.json.sha256.<pid>.tmp`) and any other write into the dataset: the training
    runs with the dataset mounted read-only, and its listing (sizes, mtimes, inodes) is
    unchanged; the digests are in the user cache."""
    prefix = _unshare()
    if prefix is None:
        pytest.skip("no mount namespace here (unshare -m and unshare -rm both refused)")
    data = bc / "data"
    before = _listing(data)
    command = (f'mount --bind "{data}" "{data}" && mount -o remount,ro,bind "{data}" && '
               f'touch "{data}/probe" 2>/dev/null && exit 99; '
               f'exec "{sys.executable}" -m embodichain train-sl --config "{bc}/r.yaml" '
               "--no-progress")
    proc = subprocess.run([*prefix, "sh", "-c", command], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 99, "the bind mount was writable"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert (bc / "run/last.pt").is_file()
    assert _listing(data) == before
    assert list((tmp_path / "digests").rglob("*.json"))


@pytest.mark.parametrize("command", [["validate-config", "--build"],
                                     ["check-data", "--no-progress"]])
def test_validate_config_build_and_check_data_write_only_the_per_user_caches(
        command: list[str], bc: Path, tmp_path: Path) -> None:
    """Catches `validate-config --build` or `check-data` writing into the dataset (digests
    cached beside its files), into a run directory (the recipe's output_dir created, or a
    run.json), or anywhere but the per-user caches they are documented to fill (digests,
    identities, video checks, the table copy: docs/commands.md): the dataset's listing with
    sizes, mtimes and inodes is the same after, the output directory does not exist, the
    working directory holds only the cache, and the cache only its documented folders."""
    data = bc / "data"
    before = _listing(data)
    output = tmp_path / "would-be-run"
    proc = run_cli(command[0], str(bc / "r.yaml"), *command[1:], "--set",
                   f"trainer.output_dir={output}", cwd=tmp_path, env=_env(tmp_path / "cache"))
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert _listing(data) == before
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]
    assert {p.name for p in (tmp_path / "cache").iterdir()} <= {
        "digests", "identities", "lerobot", "lerobot-video-checks"}
    assert list((tmp_path / "cache/lerobot").glob("*/manifest.json"))
