"""Does the ONNX artifact act as its checkpoint on the ALOHA benchmark? (R-DEPLOY-1)

    python benchmarks/aloha_artifact_parity.py --run outputs/aloha_transfer_cube
    python benchmarks/aloha_artifact_parity.py --workdir /tmp/parity --updates 300

With `--run`, that run's newest checkpoint is judged; without, a run of the transfer-cube
recipe (examples/learning/aloha/transfer_cube.yaml) is trained first for `--updates`
updates on `--demos` recorded demonstrations (parity needs no good policy, only the
same one). The checkpoint is exported (`embodichain export --policy`, ONNX), then
`embodichain eval` runs the checkpoint and the artifact on the same `--episodes` seeds
(`--seed`, default 700000: far from the recipe's validation and demonstration seeds), and
the per-episode outcomes (success, return, length) are compared. Exit 0 when every episode
agrees, 1 otherwise. Needs `pip install 'embodichain-models[sim,deploy]'`; one thread per
process (OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, bench_env

EXAMPLE = REPO / "examples" / "learning" / "aloha" / "transfer_cube.yaml"
FIELDS = ("success", "return", "length")


def _run(*args: str, cwd: Path) -> float:
    """`python -m ARGS` in `cwd`; its wall seconds (exits with its output on failure)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=bench_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def train(workdir: Path, demos: int, updates: int) -> Path:
    """The transfer-cube recipe trained for `updates` updates on `demos` demonstrations."""
    import yaml

    data = workdir / "data"
    if not (data / "meta").is_dir():
        _run("embodichain_models.data.aloha.prepare", "--task", "transfer_cube",
             "--episodes", str(demos), str(data), cwd=workdir)
    recipe = yaml.safe_load(EXAMPLE.read_text())
    recipe["device"] = "cpu"
    recipe["trainer"].update(max_updates=updates, validate_every=0, save_best=False,
                             save_every=updates,
                             log_every=max(1, updates // 5), output_dir=str(workdir / "run"))
    recipe["scheduler"]["warmup_updates"] = min(200, max(1, updates // 6))
    recipe["data"]["root"] = str(data)
    (workdir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    seconds = _run("embodichain", "train-sl", "--config", str(workdir / "recipe.yaml"),
                   "--no-progress", cwd=workdir)
    print(f"trained {updates} updates on {demos} demonstrations: {seconds:.0f} s")
    return workdir / "run"


def outcomes(out: Path) -> dict[int, tuple]:
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    return {e["seed"]: tuple(e[k] for k in FIELDS) for e in episodes if "seed" in e}


def compare(run: Path, workdir: Path, episodes: int, seed: int) -> int:
    artifact = workdir / "policy.onnx"
    _run("embodichain", "export", str(run), "--policy", str(artifact), "--force", cwd=workdir)
    found = {}
    for name, target in (("checkpoint", run), ("artifact", artifact)):
        out = workdir / f"eval_{name}"
        if out.exists():
            for path in sorted(out.rglob("*"), reverse=True):
                path.unlink() if path.is_file() else path.rmdir()
            out.rmdir()
        seconds = _run("embodichain", "eval", str(target), "--episodes", str(episodes),
                       "--seed", str(seed), "--videos", "0", "--out", str(out),
                       "--no-progress", cwd=workdir)
        found[name] = outcomes(out)
        print(f"{name}: {episodes} episodes in {seconds:.0f} s, success "
              f"{sum(o[0] for o in found[name].values())}/{episodes}")
    want, got = found["checkpoint"], found["artifact"]
    differ = [s for s in sorted(want) if want[s] != got.get(s)]
    for s in differ:
        print(f"  seed {s}: checkpoint {dict(zip(FIELDS, want[s], strict=True))}, artifact "
              f"{dict(zip(FIELDS, got.get(s, ()), strict=False))}")
    print(f"per-episode outcomes ({', '.join(FIELDS)}) differ in {len(differ)} of "
          f"{len(want)} episodes (seeds {seed}..{seed + episodes - 1})")
    return 1 if differ or len(want) != episodes else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a trained ALOHA run (else one is trained)")
    parser.add_argument("--workdir", type=Path, default=Path("aloha_parity"))
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seed", type=int, default=700000)
    parser.add_argument("--demos", type=int, default=50)
    parser.add_argument("--updates", type=int, default=300)
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    run = args.run.resolve() if args.run else train(workdir, args.demos, args.updates)
    sys.exit(compare(run, workdir, args.episodes, args.seed))


if __name__ == "__main__":
    main()
