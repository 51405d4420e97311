"""The ALOHA benchmark (R-ALOHA-1): what recording and judging cost, and the figure.

    python benchmarks/aloha.py data [--episodes 10]      # demonstration time per episode
    python benchmarks/aloha.py eval RUN_DIR [--episodes 20] [--nproc 2]   # evaluation episodes/s
    python benchmarks/aloha.py curve RUN_DIR              # success rate against updates, time
    python benchmarks/aloha.py camera [--data DIR] [--run RUN_DIR]   # the camera's costs
    python benchmarks/aloha.py gym-aloha RUN_DIR [--episodes 4]  # ours vs gym-aloha's own env

`data`: the scripted expert plus its joint-space replay per task (CPU and wall seconds per
episode, one process), and the cost of one camera frame. `eval`: closed-loop episodes per
second of `embodichain eval RUN_DIR` (the recipe's evaluation: its scenes per process, one
batched forward per step, temporal ensembling); beside it, the cost of a step of gym-aloha's
own environment, which renders three 480x640 cameras every step, and of ours. `curve`: the run's
`validation/success_rate` at each evaluation (every verdict with its Wilson 95% interval)
with the update, the training wall time to it
(evaluation time excluded and included) and the run's CPU model. `camera`: a step of our
top-camera environment (`obs_type: pixels_agent_pos`, the top camera rendered as gym-aloha
renders it) against gym-aloha's own and the state-only one, the camera policy's batched
forward from ten 480x640 frames (averaging down included), the decode of a camera dataset's
frames per example (`--data`), and a run's `time/data_wait` share (`--run`). `gym-aloha`:
the run's newest snapshot judged by its recipe's evaluation section twice, unchanged but
for the environment: in ours and in gym-aloha's own registered one
(`gym_aloha/Aloha*-v0`, `obs_type: pixels_agent_pos`, the section's step limit), episode
by episode (success, return, length and every step's joints and actions must agree; ours
ends an episode at success there, as gym-aloha's does). Needs
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
from typing import Any

from embodichain.core.evaluation.intervals import rate_with_interval, successes_of


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def data(episodes: int) -> None:
    from embodichain_models.data.aloha.record import Recorder
    from embodichain_models.envs.aloha.tasks import TASKS

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
    from embodichain_models.envs.aloha.scene import gl_backend

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


def camera(data: Path | None, run: Path | None) -> None:
    """The camera pipeline's costs: rendering, the policy's forward, decode, data wait."""
    import embodichain_models.envs  # noqa: F401 - registers the ids
    import gymnasium as gym
    import numpy as np
    import torch
    from embodichain_models.envs.aloha.scene import gl_backend

    gl_backend()
    from gym_aloha.env import AlohaEnv

    top = gym.make("embodichain_models/AlohaTransferCube-v0",
                   obs_type="pixels_agent_pos").unwrapped
    state = gym.make("embodichain_models/AlohaTransferCube-v0").unwrapped
    theirs = AlohaEnv("transfer_cube", obs_type="pixels_agent_pos")
    for env in (top, state, theirs):
        env.reset(seed=100_000)
    action = state.scene.qpos.astype(np.float32)
    for name, env, steps in (("gym-aloha's (top, angle, front_close at 480x640)", theirs, 5),
                             ("our top-camera (top at 480x640)", top, 20),
                             ("our state-only", state, 200)):
        wall, cpu = _clock()
        for _ in range(steps):
            env.step(action)
        w, c = _clock()
        print(f"a step of {name} environment: {(w - wall) / steps * 1000:.1f} ms wall, "
              f"{(c - cpu) / steps * 1000:.1f} ms CPU")
    from embodichain_models.policies.act.model import ActPolicy, ActShape

    stats = {k: {"mean": torch.zeros(14), "std": torch.ones(14)}
             for k in ("observation.state", "action")}
    model = ActPolicy(ActShape(14, 0, 14, 50, cameras=("top",),
                               image_sizes=((120, 160),)), stats).eval()
    frames = torch.randint(0, 256, (10, 480, 640, 3), dtype=torch.uint8)
    obs = {"observation.state": torch.zeros(10, 14), "observation.images.top": frames}
    model.act_chunk(obs)
    wall = time.perf_counter()
    for _ in range(5):
        model.act_chunk(obs)
    print(f"camera policy (recipe's size, 120x160 backbone) forward for 10 scenes from "
          f"480x640 frames: {(time.perf_counter() - wall) / 5 * 1000:.0f} ms "
          f"({torch.get_num_threads()} threads)")
    if data is not None:
        from embodichain_models.data.lerobot.dataset import LeRobotFrames

        frames_ds = LeRobotFrames(data, features=["observation.images.top"])
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(frames_ds), 200)
        frames_ds[int(picks[0])]
        wall, cpu = _clock()
        for i in picks:
            image = frames_ds[int(i)]["observation.images.top"]
        w, c = _clock()
        print(f"decode of {data} ({list(image.shape)} frames), random examples in one "
              f"process: {(w - wall) / len(picks) * 1000:.2f} ms wall, "
              f"{(c - cpu) / len(picks) * 1000:.2f} ms CPU per example")
    if run is not None:
        records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
        waits = [r["time/data_wait"] for r in records if "time/data_wait" in r]
        worst = [r["time/data_wait_max"] for r in records if "time/data_wait_max" in r]
        if waits:
            print(f"{run}: time/data_wait (rank 0's share of the wall time) mean "
                  f"{np.mean(waits):.3f}, max {np.max(waits):.3f}; slowest rank's mean "
                  f"{np.mean(worst):.3f} over {len(waits)} log records")


def gym_aloha(run: Path, episodes: int) -> None:
    """The run's camera policy in our top-camera environment and in gym-aloha's own."""
    from embodichain_models.envs.aloha.tasks import TASKS
    from embodichain_models.policies.act.sl_recipe import policy_factory

    from embodichain.core.deploy.trained import trained_model
    from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation, Overrides
    from embodichain.core.recipe.evaluation_schema import EvaluationConfig

    checkpoint = run / "last.pt"
    trained = trained_model(checkpoint)
    section = dict(trained.run["config"]["evaluation"])
    task = TASKS[trained.run["config"]["data"]["task"]]
    # gym-aloha ends an episode at the top reward; the recipes run ours on to the limit for
    # the strict verdict (terminate_on_success: false). Compared step by step, ours ends
    # there too: the field's verdict, the return and the length are then gym-aloha's own.
    ours = EvaluationConfig.model_validate({**section, "env": {
        **section["env"], "kwargs": {**section["env"].get("kwargs", {}),
                                     "terminate_on_success": True}}})
    env = {**section["env"], "id": task.gym_aloha_id, "import": "gym_aloha",
           "kwargs": {"obs_type": "pixels_agent_pos",
                      "max_episode_steps": section.get("max_steps", 400)}}
    theirs = EvaluationConfig.model_validate({**section, "env": env})
    results = {}
    for name, config in (("ours", ours), ("gym-aloha's", theirs)):
        traced: list[Any] = []

        def make_policy(model: Any, device: Any, traced: list = traced) -> Any:
            traced.append(_Traced(policy_factory(trained.model.shape.execution)(model, device)))
            return traced[-1]

        wall = time.perf_counter()
        result = ClosedLoopEvaluation(config, make_policy).run(
            trained.model, "cpu", lockstep=False,
            overrides=Overrides(episodes=episodes, videos=0))
        records = [{k: r[k] for k in ("seed", "success", "return", "length")}
                   for r in result.records]
        results[name] = (records, traced[-1].digest.hexdigest())
        print(f"{name} environment ({config.env.id}): {episodes} episodes in "
              f"{time.perf_counter() - wall:.0f} s: {records}; joints and actions of every "
              f"step: sha256 {results[name][1][:16]}")
    same = results["ours"] == results["gym-aloha's"]
    print(f"per-episode outcomes and every step's joints and actions "
          f"{'EQUAL' if same else 'DIFFER'} (update {trained.step})")
    if not same:
        raise SystemExit(1)


class _Traced:
    """A closed-loop policy that digests the joint positions it sees and its actions."""

    def __init__(self, policy: Any) -> None:
        import hashlib

        self.policy, self.digest = policy, hashlib.sha256()

    def reset(self, env_index: int) -> None:
        self.policy.reset(env_index)

    def act(self, observations: Any) -> Any:
        import numpy as np
        from embodichain_models.policies.act.execution import observed

        joints = np.asarray(observed(observations, "observation.state"), np.float64)
        actions = self.policy.act(observations)
        self.digest.update(joints.tobytes() + np.asarray(actions).tobytes())
        return actions


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
        verdicts = {k.removeprefix("validation/").removesuffix("_rate"): v
                    for k, v in r.items() if k.startswith("validation/") and
                    k.endswith("_rate")}
        print("    " + ", ".join(  # each with its Wilson 95% interval over the episodes
            f"{k} {rate_with_interval(successes_of(v, count), count)}" if count else
            f"{k} {v:.2f}" for k, v in sorted(verdicts.items())))
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
    g = sub.add_parser("gym-aloha")
    g.add_argument("run", type=Path, help="a camera run's directory (its last.pt acts)")
    g.add_argument("--episodes", type=int, default=4)
    m = sub.add_parser("camera")
    m.add_argument("--data", type=Path, help="a dataset recorded with --cameras top")
    m.add_argument("--run", type=Path, help="a camera run's directory (its data wait)")
    args = parser.parse_args()
    if args.what == "data":
        data(args.episodes)
    elif args.what == "eval":
        evaluation(args.run, args.episodes, args.nproc)
    elif args.what == "camera":
        camera(args.data, args.run)
    elif args.what == "gym-aloha":
        gym_aloha(args.run, args.episodes)
    else:
        curve(args.run)


if __name__ == "__main__":
    main()
