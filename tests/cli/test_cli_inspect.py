"""`inspect-checkpoint` on a real 2-worker checkpoint (R-INSP-1), and on a sharded one of a
one-process fsdp run (R-SHARD-4)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO, run_cli, worker_env, write_recipe
from tests.support.cli import cli_in_process, invoke

PARAMETERS = 4 * 32 + 32 + 32 * 2 + 2  # the 4 -> 32 -> 2 MLP of cpu.yaml


@pytest.fixture(scope="module")
def step_100(sl_ddp_two_workers: Path) -> Path:
    return sl_ddp_two_workers / "step_100.pt"


@pytest.mark.slow  # a few seconds: kept out of the quick loop
def test_tables_show_identity_model_optimizer_ranks_and_metrics(step_100: Path) -> None:
    result = invoke("inspect-checkpoint", str(step_100))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert re.search(r"^step\s+100\s*$", out, re.M), out
    assert re.search(r"^world size\s+2\s*$", out, re.M), out
    assert re.search(r"^factory\s+sl_ddp\s*$", out, re.M), out
    assert "embodichain.checkpoint version 1" in out
    assert "verified" in out and "matches the stored recipe" in out
    assert f"parameters  {PARAMETERS} in 4 tensors" in out
    assert "Adam (recipe: adam)" in out
    assert re.search(r"^lr\s+0\.001\s*$", out, re.M), out
    assert "all 2 ranks present" in out
    assert re.search(r"│\s+0 │ yes .*100 batches", out) and re.search(r"│\s+1 │ yes", out)
    assert "validation/mse" in out
    assert "[32, 4]" not in out  # shapes only on request
    tensors = invoke("inspect-checkpoint", str(step_100), "--tensors").stdout
    for name, shape in [("0.weight", "[32, 4]"), ("0.bias", "[32]"), ("2.weight", "[2, 32]")]:
        assert re.search(rf"{re.escape(name)}\s*│ parameter │ {re.escape(shape)}", tensors)


def test_json_is_one_plain_document(step_100: Path) -> None:
    proc = cli_in_process("inspect-checkpoint", str(step_100), "--json", "--tensors")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout  # no colour codes
    report = json.loads(proc.stdout)  # exactly one document, nothing else on stdout
    assert report["step"] == 100 and type(report["step"]) is int
    assert report["world_size"] == 2 and type(report["world_size"]) is int
    assert report["format"] == "embodichain.checkpoint" and report["digest_verified"] is True
    assert report["factory"] == "sl_ddp" and report["config_matches_hash"] is True
    assert len(report["run_id"]) == 32
    assert report["source_identity"].startswith("sha256:")
    assert {"python", "torch", "embodichain"} <= set(report["versions"])
    model = report["model"]
    assert model["parameters"] == PARAMETERS and model["bytes"] == 4 * PARAMETERS
    assert model["dtypes"] == {"float32": PARAMETERS}
    assert [t["shape"] for t in model["tensors"]] == [[32, 4], [32], [2, 32], [2]]
    opt = report["optimizer"]
    assert opt["type"] == "Adam" and opt["step"] == 100
    assert opt["hyper_parameters"][0]["lr"] == 0.001
    assert opt["hyper_parameters"][0]["betas"] == [0.9, 0.999]
    ranks = report["ranks"]
    assert ranks["complete"] is True and set(ranks["per_rank"]) == {"0", "1"}
    for state in ranks["per_rank"].values():
        assert state["torch_rng"] and state["python_rng"] and not state["cuda_rng"]
        assert state["sampler"]["batches_drawn"] == 100
    assert "validation/mse" in report["metrics"]
    assert report["config"]["optimizer"]["lr"] == 0.001


def test_config_with_changed_lr_reports_the_difference(step_100: Path, tmp_path: Path) -> None:
    changed = write_recipe(tmp_path / "lr.yaml", tmp_path / "fresh", **{"optimizer.lr": 0.01})
    result = invoke("inspect-checkpoint", str(step_100), "--config", str(changed))
    assert result.exit_code == 1, result.output  # 1: may not resume (design §9)
    assert re.search(r"resume from it\? no", result.stdout), result.stdout
    assert "optimizer.lr: checkpoint 0.001, this run 0.01" in result.stdout

    proc = cli_in_process("inspect-checkpoint", str(step_100), "--json", "--config", str(changed))
    assert proc.returncode == 1, proc.stderr
    check = json.loads(proc.stdout)["resume"]
    assert check["compatible"] is False
    assert check["differences"] == ["optimizer.lr: checkpoint 0.001, this run 0.01"]


def test_config_that_may_resume(step_100: Path, tmp_path: Path) -> None:
    # max_updates raised and a fresh output_dir are allowed changes (R-RESUME-2, -3)
    same = write_recipe(tmp_path / "same.yaml", tmp_path / "fresh",
                        **{"trainer.max_updates": 400, "trainer.log_every": 5})
    result = invoke("inspect-checkpoint", str(step_100), "--config", str(same), "--json")
    assert result.exit_code == 0, result.output
    check = json.loads(result.stdout)["resume"]
    assert check["compatible"] is True, check
    assert any("--nproc-per-node=2" in c for c in check["conditions"])
    # ...but not below the checkpoint's step, and not into the run's own (later) history
    lower = invoke("inspect-checkpoint", str(step_100), "--config", str(same), "--json",
                   "--set", "trainer.max_updates=50")
    assert lower.exit_code == 1, lower.output
    assert any("below the checkpoint's update 100" in d
               for d in json.loads(lower.stdout)["resume"]["differences"])
    in_place = invoke("inspect-checkpoint", str(step_100), "--config", str(same), "--json",
                      "--set", f"trainer.output_dir={step_100.parent}")
    assert in_place.exit_code == 1, in_place.output
    problems = json.loads(in_place.stdout)["resume"]["problems"]
    assert any("beyond the checkpoint's update 100" in p for p in problems), problems


def test_works_without_the_recipe_code(step_100: Path, tmp_path: Path) -> None:
    """The factory's module is made unimportable: inspection still works, --config degrades."""
    changed = write_recipe(tmp_path / "lr.yaml", tmp_path / "fresh", **{"optimizer.lr": 0.01})
    code = (
        "import sys\n"
        "sys.modules['embodichain.plugins.sl_ddp'] = None  # as if not installed\n"
        "from embodichain.cli import app\n"
        f"app(['inspect-checkpoint', {str(step_100)!r}, '--json', '--config', "
        f"{str(changed)!r}])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=worker_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the report, and the verdict: may not resume
    report = json.loads(proc.stdout)
    assert report["step"] == 100 and report["world_size"] == 2
    check = report["resume"]
    assert check["compared"] == "recipe as written" and "cannot be loaded" in check["note"]
    assert check["compatible"] is False
    assert "optimizer.lr: checkpoint 0.001, this run 0.01" in check["differences"]


def _tensor_byte(path: Path) -> int:
    """Offset of a byte inside the largest stored tensor (not zip padding or headers)."""
    with zipfile.ZipFile(path) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:
                                                   info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len + info.compress_size // 2


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damaged_file_is_a_named_error(step_100: Path, tmp_path: Path, damage: str) -> None:
    path = tmp_path / "damaged.pt"
    shutil.copy(step_100, path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[_tensor_byte(path)] ^= 0xFF
    else:
        data = bytearray(b"not a checkpoint")
    path.write_bytes(bytes(data))
    result = invoke("inspect-checkpoint", str(path))
    assert result.exit_code == 2, result.output
    # Rough edge (issue 40): a file that is no torch file at all is said to be one, not
    # "corrupt or truncated" (which sends the user looking for a torn write).
    said = " ".join(result.stderr.split())
    expected = ("not an embodichain checkpoint: not a torch file" if damage == "garbage"
                else "corrupt")
    assert expected in said and str(path) in said
    assert "Traceback" not in result.output and result.stdout == ""


def test_missing_file_and_run_directory(step_100: Path, tmp_path: Path) -> None:
    missing = invoke("inspect-checkpoint", str(tmp_path / "nope.pt"))
    assert missing.exit_code == 2 and "checkpoint not found" in missing.stderr
    run_dir = invoke("inspect-checkpoint", str(step_100.parent), "--json")
    assert run_dir.exit_code == 0 and json.loads(run_dir.stdout)["step"] == 200  # its last.pt
    empty = invoke("inspect-checkpoint", str(tmp_path))
    assert empty.exit_code == 2 and "without a snapshot" in empty.stderr
    # Without last.pt, a directory means the snapshot `resume` would take: the newest step
    # file (a variant reading only last.pt refuses here).
    copy = tmp_path / "copy"
    shutil.copytree(step_100.parent, copy)
    (copy / "last.pt").unlink()
    newest = invoke("inspect-checkpoint", str(copy), "--json")
    assert newest.exit_code == 0 and json.loads(newest.stdout)["step"] == 200, newest.stderr
    assert "last.pt is missing" in newest.stderr


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sharded")
    recipe = write_recipe(root / "r.yaml", root / "run", **{
        "trainer.strategy": "fsdp", "trainer.max_updates": 4, "trainer.save_every": 4,
        "trainer.validate_every": 0})
    proc = run_cli("train-sl", "--config", str(recipe), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return root / "run"


def test_sharded_checkpoint_whose_shard_does_not_verify_exits_one(sharded_run: Path,
                                                                  tmp_path: Path) -> None:
    """A sharded checkpoint is reported shard by shard; one whose shard is missing, or was
    altered and re-digested (it verifies on its own, not against the manifest's digest of
    it), cannot be resumed or exported, and the command exits 1 as for any checkpoint that
    does not verify. Catches: exit 0 for such a checkpoint, or a shard checked against its
    own digest only (the manifest's recorded digest not compared)."""
    from embodichain.core.checkpoint.file import make_checkpoint, read_checkpoint, write_checkpoint
    from embodichain.core.checkpoint.sharded import shard_table

    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    last = run / "last.pt"
    whole = invoke("inspect-checkpoint", str(last))
    assert whole.exit_code == 0 and "all shards verified" in whole.stdout, whole.output
    shard = run / shard_table(read_checkpoint(last))[0]["file"]
    payload = read_checkpoint(shard)["payload"]
    payload["model"]["0.weight"][0, 0] += 1.0
    write_checkpoint(make_checkpoint(payload), shard)
    read_checkpoint(shard)  # self-consistent: its own digest verifies
    altered = invoke("inspect-checkpoint", str(last), "--json")
    assert altered.exit_code == 1, altered.output
    [row] = json.loads(altered.stdout)["shards"]
    assert row["verified"] is False and "the manifest's digest" in row["problem"], row
    shard.unlink()
    missing = invoke("inspect-checkpoint", str(last))
    assert missing.exit_code == 1, missing.output
    assert "cannot be resumed or exported" in missing.stdout, missing.output
    assert "rank 0 is missing" in missing.stdout, missing.output
