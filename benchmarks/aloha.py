"""The ALOHA benchmark (R-ALOHA-1): what recording and judging cost, and the figure.

    python benchmarks/aloha.py data [--episodes 10]      # demonstration time per episode
    python benchmarks/aloha.py eval RUN_DIR [--episodes 20] [--nproc 2]   # evaluation episodes/s
    python benchmarks/aloha.py curve RUN_DIR              # success rate against updates, time

`data`: the scripted expert plus its joint-space replay per task (CPU and wall seconds per
episode, one process), and the cost of one camera frame. `eval`: closed-loop episodes per
second of `embodichain eval RUN_DIR` (the recipe's evaluation: its scenes per process, one
batched forward per step, temporal ensembling); beside it, the cost of a step of gym-aloha's
own environment, which renders three 480x640 cameras every step, and of ours. `curve`: the run's
`validation/success_rate` at each evaluation with the update, the training wall time to it
(evaluation time excluded and included) and the run's CPU model. Needs
`pip install 'embodichain-models[sim]'`; run with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def data(episodes: int) -> None:
    from embodichain_models.policies.aloha.record import Recorder
    from embodichain_models.policies.aloha.tasks import TASKS

    for name, task in TASKS.items():
        recorder = Recorder(task)
        wall, cpu = _clock()
        demos = [recorder.demonstrate(seed) for seed in range(episodes)]
        w, c = _clock()
        print(f"{name}: {episodes} episodes (expert in the end-effector scene, recorded in "
              f"the joint-space scene), {(w - wall) / episodes:.2f} s wall, "
              f"{(c - cpu) / episodes:.2f} s CPU per episode; expert: top reward reached "
              f"{sum(d.success for d in demos)}/{episodes}, task done at step "
              f"{len(demos[0].rewards)} {sum(d.finished for d in demos)}/{episodes} (top "
              f"reward at that step {sum(d.rewards[-1] >= 4 for d in demos)}/{episodes})")
    try:
        recorder.scene.check_camera("top")
    except Exception as exc:  # noqa: BLE001
        print(f"camera: not measured ({exc})")
        return
    for size in ((480, 640), (240, 320)):
        wall, cpu = _clock()
        for _ in range(5):
            recorder.render("top", size)
        w, c = _clock()
        print(f"camera top {size[0]}x{size[1]}: {(w - wall) / 5:.3f} s wall, "
              f"{(c - cpu) / 5:.3f} s CPU per frame (MUJOCO_GL={os.environ.get('MUJOCO_GL')})")


def evaluation(run: Path, episodes: int, nproc: int) -> None:
    """`embodichain eval RUN` timed: episodes per second of the whole command (start-up
    included) and per second of its evaluation; then the cost of one step."""
    out = Path(tempfile.mkdtemp(prefix="aloha_eval_"))
    command = [sys.executable, "-m", "embodichain", "eval", str(run), "--episodes",
               str(episodes), "--out", str(out / "eval"), "--no-progress", "--videos", "0"]
    if nproc > 1:
        command += ["--nproc-per-node", str(nproc)]
    wall = time.perf_counter()
    proc = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True)
    wall = time.perf_counter() - wall
    if proc.returncode != 0:
        raise SystemExit(proc.stdout + proc.stderr)
    summary = json.loads((out / "eval" / "summary.json").read_text())
    inner = summary.get("wall_s") or summary.get("time/evaluation_s") or wall
    print(f"embodichain eval, {nproc} process(es), {episodes} episodes: "
          f"{episodes / wall:.3f} episodes/s (command, {wall:.0f} s), "
          f"{episodes / inner:.3f} episodes/s (evaluation, {inner:.0f} s); "
          f"success {summary.get('metrics', summary).get('validation/success_rate')}")
    shutil.rmtree(out)
    step_costs()


def step_costs() -> None:
    """One step of gym-aloha's environment (three cameras rendered) against ours."""
    import embodichain_models.envs  # noqa: F401 - registers the ids
    import gymnasium as gym
    from embodichain_models.policies.aloha.scene import gl_backend

    gl_backend()
    from gym_aloha.env import AlohaEnv

    ours = gym.make("embodichain_models/AlohaTransferCube-v0").unwrapped
    theirs = AlohaEnv("transfer_cube")
    ours.reset(seed=100_000)
    theirs.reset(seed=100_000)
    action = ours.scene.qpos.copy()
    for name, env, steps in (("gym-aloha's (3 cameras rendered)", theirs, 5),
                             ("embodichain's (state only)", ours, 200)):
        wall = time.perf_counter()
        for _ in range(steps):
            env.step(action)
        print(f"a step of {name} environment: "
              f"{(time.perf_counter() - wall) / steps * 1000:.1f} ms")


def curve(run: Path) -> None:
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    meta = json.loads((run / "run.json").read_text())
    print(f"run {meta.get('run_id')} world size {meta.get('world_size')}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    evals = [r for r in records if "validation/success_rate" in r]
    before = 0.0  # evaluation time before this update's evaluation
    for r in evals:
        elapsed = max((x["time/elapsed_s"] for x in records
                       if x["step"] <= r["step"] and "time/elapsed_s" in x), default=0.0)
        took = r.get("time/evaluation_s", 0.0)
        episodes = run / "evaluations" / f"update_{r['step']:06d}.jsonl"
        count = len(episodes.read_text().splitlines()) if episodes.is_file() else 0
        print(f"update {r['step']:>6}: success {r['validation/success_rate']:.2f} "
              f"({r.get('validation/episode_length', float('nan')):.0f} steps mean); "
              f"training {(elapsed - before) / 60:.1f} min wall, + {before / 60:.1f} min of "
              f"earlier evaluations; this evaluation {took / 60:.1f} min "
              f"({count} episodes, {count / took if took else 0:.2f} episodes/s)")
        before += took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    d = sub.add_parser("data")
    d.add_argument("--episodes", type=int, default=10)
    e = sub.add_parser("eval")
    e.add_argument("run", type=Path, help="a run directory (its newest snapshot acts)")
    e.add_argument("--episodes", type=int, default=20)
    e.add_argument("--nproc", type=int, default=1)
    c = sub.add_parser("curve")
    c.add_argument("run", type=Path)
    args = parser.parse_args()
    if args.what == "data":
        data(args.episodes)
    elif args.what == "eval":
        evaluation(args.run, args.episodes, args.nproc)
    else:
        curve(args.run)


if __name__ == "__main__":
    main()
