"""R-CKPT-2: a SIGKILL at any instant leaves every checkpoint, run.json and metrics.jsonl readable.

One-process runs saving every update are killed at random moments by
tests/recovery/sigkill_driver.py (one process suffices: rank 0 alone writes): fresh runs, and
chains in which a killed run is resumed in place and killed again. After each kill every
`*.pt` verifies, `last.pt` exists once any step file does and is never older than the newest
one, run.json parses and read_metrics never raises; and every surviving checkpoint holds
exactly the state of the uninterrupted run at its step.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, worker_env, write_recipe
from recovery_helpers import HERE, assert_state_equal

from embodichain.core.checkpoint import read_checkpoint, step_files
from embodichain.core.run_dir import read_metrics

FRESH_KILLS, CHAIN_KILLS, SEED = 16, 8, 20240601


def _read(path: Path, cache: dict[int, dict]) -> dict:
    """read_checkpoint, once per inode: chain snapshots hard-link unchanged checkpoints."""
    inode = path.stat().st_ino
    if inode not in cache:
        cache[inode] = read_checkpoint(path)
    return cache[inode]


def _verify(directory: Path, reference: dict[int, dict], fresh: bool, cache: dict[int, dict]
            ) -> dict[str, int]:
    checkpoints = {p.name: _read(p, cache) for p in directory.glob("*.pt")}  # all verify
    assert not [p for p in directory.glob("*.pt") if not p.is_file()]
    steps = [n for n, _ in step_files(directory)]
    last_step = None
    if steps:
        assert "last.pt" in checkpoints, f"{directory}: step files without last.pt"
    if "last.pt" in checkpoints:
        last_step = checkpoints["last.pt"]["manifest"]["step"]
        assert last_step >= max(steps, default=0), f"{directory}: last.pt older than a step file"
    if fresh:  # an uninterrupted sequence step_1 .. step_N, and last.pt at N or N + 1
        assert steps == list(range(1, len(steps) + 1)), f"{directory}: {steps}"
        if steps:
            assert last_step in (steps[-1], steps[-1] + 1)
    for name, data in checkpoints.items():
        step = data["manifest"]["step"]
        assert name in ("last.pt", f"step_{step}.pt")
        if step in reference:
            assert_state_equal(data["payload"]["learner"], reference[step]["learner"], name)
            assert_state_equal(data["payload"]["ranks"], reference[step]["ranks"], name)

    run = json.loads((directory / "run.json").read_text()) if (directory / "run.json").exists() \
        else None
    if checkpoints:
        assert run is not None and run["run_id"] == checkpoints["last.pt"]["manifest"]["run_id"]
    log = read_metrics(directory / "metrics.jsonl")  # never raises
    assert not log.bad_lines
    logged = [r["step"] for r in log.records]
    if fresh:  # log_every=1: record N is written just before checkpoint N
        assert logged == list(range(1, len(logged) + 1))
        if last_step is not None:
            assert len(logged) in (last_step, last_step + 1)
    return {"checkpoints": len(checkpoints), "compared": sum(
        1 for d in checkpoints.values() if d["manifest"]["step"] in reference)}


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_everything_readable(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path / "every_update.yaml", tmp_path / "unused",
                          **{"trainer.max_updates": 1_000_000, "trainer.save_every": 1,
                             "trainer.log_every": 1, "trainer.validate_every": 0})
    root = tmp_path / "kills"
    proc = subprocess.run([sys.executable, str(HERE / "sigkill_driver.py"), str(recipe),
                           str(root), str(FRESH_KILLS), str(CHAIN_KILLS), str(SEED)],
                          cwd=REPO, env=worker_env(PYTHONPATH=str(REPO)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + "".join(
        f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((root / "logs").glob("*")))
    report = json.loads(proc.stdout)

    ref_dir = Path(report["reference"]["dir"])
    reference = {n: read_checkpoint(p)["payload"] for n, p in step_files(ref_dir)}
    assert sorted(reference) == list(range(1, report["reference"]["updates"] + 1))

    kills = report["kills"]
    assert all(k.get("signal") == 9 for k in kills), kills  # no child ended on its own
    assert len(kills) >= 20
    totals = {"checkpoints": 0, "compared": 0}
    cache: dict[int, dict] = {}
    for kill in kills:
        counts = _verify(Path(kill["dir"]), reference, kill["kind"] == "fresh", cache)
        totals = {k: totals[k] + counts[k] for k in totals}
    # the kills did land during training and saving ...
    assert sum(1 for k in kills if any(Path(k["dir"]).glob("step_*.pt"))) >= len(kills) // 2
    assert totals["compared"] >= 100, totals
    # ... and killed runs were resumed in place, continued (exactly: compared above), and
    # recorded each resume in run.json
    progressed = 0
    for before, after in zip(kills, kills[1:], strict=False):
        if after.get("resumed") and after["chain"] == before.get("chain"):
            old, new = (_last_step(Path(k["dir"])) for k in (before, after))
            if new is not None and old is not None and new > old:
                progressed += 1
                events = json.loads((Path(after["dir"]) / "run.json").read_text())["events"]
                assert events and all(e["event"] == "resumed" for e in events)
    assert progressed >= 1, report


def _last_step(directory: Path) -> int | None:
    last = directory / "last.pt"
    return read_checkpoint(last)["manifest"]["step"] if last.exists() else None
