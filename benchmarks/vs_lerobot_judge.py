"""`vs_lerobot.py judge` and `as-shipped`: a lerobot-trained ACT and ours judged on the same
test seeds in our environment (see vs_lerobot.py's docstring).

A lerobot checkpoint acts through `lerobot_adapter.LerobotActAdapter` in a child process run
by the side venv's Python (lerobot's own dependencies first: its PyAV differs from ours),
with this venv's site-packages added after them for our environment (both venvs hold the
same CPU torch 2.13 and Python), the torchvision shim on PYTHONPATH. `batch` scenes step
together (reset with seeds S+e, run to `max_steps`, never ended at success), so lerobot's
temporal ensembler and chunk queue see one synchronous batch; each episode's verdicts are
`AlohaJudge`'s, the ones `embodichain eval` gives ours.
"""

from __future__ import annotations

import argparse
import json
import os
import site
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
from lerobot_adapter import (
    ACTION,
    IMAGE_PREFIX,
    STATE,
    LerobotActAdapter,
    LerobotNormalisation,
    read_stats,
)

OUTCOMES = ("success", "strict_success")


OUR_SITE = "EMBODICHAIN_SITE_PACKAGES"


def lerobot_child(args: argparse.Namespace, out: Path) -> dict:
    """Run `judge-lerobot` under the side venv's Python; its result."""
    from common import bench_env
    from vs_lerobot import torchvision_ops_shim

    shim = torchvision_ops_shim(out / "tvops")
    command = [str(args.venv / "bin" / "python"), str(Path(__file__).with_name("vs_lerobot.py")),
               "judge-lerobot", str(args.lerobot_run.resolve()), "--data",
               str(args.data.resolve()), "--seed", str(args.seed), "--episodes",
               str(args.episodes), "--batch", str(args.batch), "--max-steps",
               str(args.max_steps), "--out", str(out)]
    env = bench_env(shim, **{OUR_SITE: sysconfig.get_paths()["purelib"],
                             "HF_HUB_OFFLINE": "1"})
    subprocess.run(command, check=True, env=env)
    return json.loads((out / "lerobot.json").read_text())


def load_adapter(checkpoint: Path, data: Path) -> tuple[LerobotActAdapter, dict]:
    """The adapter around the lerobot policy saved at `checkpoint` (a run's
    checkpoints/NNN or its pretrained_model directory), normalising with `data`'s stats."""
    from lerobot.policies.act.modeling_act import ACTPolicy

    model_dir = checkpoint / "pretrained_model" if (checkpoint / "pretrained_model").is_dir() \
        else checkpoint
    policy = ACTPolicy.from_pretrained(str(model_dir)).eval()
    config = json.loads((model_dir / "config.json").read_text())
    cameras = {k[len(IMAGE_PREFIX):]: tuple(f["shape"][1:])
               for k, f in config["input_features"].items() if k.startswith(IMAGE_PREFIX)}
    train = json.loads((model_dir / "train_config.json").read_text())
    imagenet = bool(train.get("dataset", {}).get("use_imagenet_stats", True))
    keys = [STATE, ACTION, *(IMAGE_PREFIX + c for c in cameras)]
    adapter = LerobotActAdapter(policy, LerobotNormalisation(read_stats(data, keys, imagenet)),
                                cameras)
    return adapter, {"model_dir": str(model_dir), "imagenet_stats": imagenet,
                     "cameras": {c: list(s) for c, s in cameras.items()}}


def check_against_lerobot(adapter: LerobotActAdapter, model_dir: Path,
                          observations: dict) -> float:
    """The largest difference between the adapter's normalised inputs and lerobot's own
    preprocessor's (from the checkpoint's saved pipeline) for `observations`; raises
    beyond 1e-5."""
    from lerobot.processor import PolicyProcessorPipeline

    pre = PolicyProcessorPipeline.from_pretrained(
        str(model_dir), config_filename="policy_preprocessor.json")
    raw = adapter.inputs(observations)
    theirs = pre(dict(raw))
    ours = adapter.normalisation.observation(raw)
    worst = max(float((ours[k] - theirs[k].reshape(ours[k].shape)).abs().max()) for k in ours)
    if worst > 1e-5:
        raise SystemExit(f"the adapter normalises unlike lerobot's preprocessor: {worst}")
    return worst


def run_episodes(adapter: LerobotActAdapter, seed: int, episodes: int, batch: int,
                 max_steps: int, model_dir: Path) -> tuple[list[dict], float]:
    from embodichain_models.envs.aloha.env import AlohaEnv
    from embodichain_models.envs.aloha.judge import AlohaJudge

    envs = [AlohaEnv("transfer_cube", obs_type="pixels_agent_pos", terminate_on_success=False)
            for _ in range(min(batch, episodes))]
    records, checked = [], None
    for first in range(seed, seed + episodes, len(envs)):
        seeds = list(range(first, min(first + len(envs), seed + episodes)))
        active = envs[:len(seeds)]
        obs = [env.reset(seed=s)[0] for env, s in zip(active, seeds, strict=True)]
        judges = [AlohaJudge() for _ in active]
        returns = [0.0] * len(active)
        adapter.reset()
        for _ in range(max_steps):
            stacked = {"agent_pos": np.stack([o["agent_pos"] for o in obs]),
                       "pixels": {"top": np.stack([o["pixels"]["top"] for o in obs])}}
            if checked is None:
                checked = check_against_lerobot(adapter, model_dir, stacked)
            actions = adapter.act(stacked)
            for i, env in enumerate(active):
                obs[i], reward, terminated, truncated, info = env.step(actions[i])
                judges[i].step(info, reward, terminated, truncated)
                returns[i] += float(reward)
        records += [{"seed": s, "return": r, **j.outcomes()}
                    for s, r, j in zip(seeds, returns, judges, strict=True)]
        print(json.dumps(records[-len(seeds):]), flush=True)
    return records, checked or 0.0


def rates(records: list[dict]) -> dict[str, dict]:
    # imported here: the lerobot child reaches our packages only once judge_lerobot added them
    from embodichain.core.evaluation.intervals import wilson_interval

    n = len(records)
    out = {}
    for name in OUTCOMES:
        k = sum(bool(r[name]) for r in records)
        low, high = wilson_interval(k, n)
        out[name] = {"successes": k, "episodes": n, "rate": k / n if n else 0.0,
                     "wilson95": [round(low, 4), round(high, 4)]}
    return out


def start_ours(run: Path, seed: int, episodes: int, out: Path) -> subprocess.Popen:
    """Ours on the same seeds, through `embodichain eval`, started in the background (it
    runs beside lerobot's episodes: each renders on about one core)."""
    return subprocess.Popen([sys.executable, "-m", "embodichain", "eval", str(run), "--seed",
                             str(seed), "--episodes", str(episodes), "--out", str(out),
                             "--no-progress"])


def ours_rates(eval_run: subprocess.Popen, out: Path) -> dict:
    """The rates of ours' finished `embodichain eval` (its episodes.jsonl)."""
    if eval_run.wait() != 0:
        raise SystemExit(f"embodichain eval failed (exit {eval_run.returncode}): {out}")
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()
               if line.strip()]
    flat = [{name: r.get(name, r.get("outcomes", {}).get(name)) for name in OUTCOMES}
            for r in records]
    return rates(flat)


def judge_lerobot(args: argparse.Namespace) -> None:
    """(In the side venv's Python.) lerobot's episodes, into OUT/lerobot.json."""
    site.addsitedir(os.environ[OUR_SITE])  # after lerobot's: our environment's packages
    adapter, about = load_adapter(args.lerobot_run, args.data)
    torch.manual_seed(0)
    start = time.perf_counter()
    records, checked = run_episodes(adapter, args.seed, args.episodes, args.batch,
                                    args.max_steps, Path(about["model_dir"]))
    result = {**about, "seeds": [args.seed, args.seed + args.episodes - 1],
              "max_steps": args.max_steps, "normalisation_vs_lerobot": checked,
              "wall_s": round(time.perf_counter() - start, 1), **rates(records),
              "episodes": records}
    (args.out / "lerobot.json").write_text(json.dumps(result, indent=1))


def judge(args: argparse.Namespace) -> None:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    result = {}
    ours = (start_ours(args.ours, args.seed, args.episodes, out / "ours_eval")
            if args.ours is not None else None)
    try:
        theirs = lerobot_child(args, out)
    except BaseException:  # a failed or interrupted child: leave no eval running behind
        if ours is not None:
            ours.kill()
        raise
    if ours is not None:
        result["ours"] = ours_rates(ours, out / "ours_eval")
    result["lerobot"] = {k: v for k, v in theirs.items() if k != "episodes"}
    (out / "judge.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def as_shipped(args: argparse.Namespace) -> None:
    """Both as each ships, the same wall-clock minutes each, one after the other (ours
    first), stopped by SIGTERM at the limit (ours then saves a snapshot; lerobot's newest
    is its last `save_freq` one); then, with `--judge N`, both judged on N test seeds
    as `judge` does (else its command is printed).

    Ours: the recipe as written on 2 processes (batch 16 each, global 32), validation off.
    lerobot: ACT's defaults (dim 512, chunk 100, n_action_steps 100, the VAE, lr 1e-5,
    batch 8, ImageNet statistics), the backbone from scratch (ImageNet weights are out of
    reach here), one data worker (its default 4 would crowd 2 cores), as many intra-op
    threads as cores (torch's default in one process)."""
    from common import bench_env
    from vs_lerobot import bounded, lerobot_command, torchvision_ops_shim, train_sl

    out = args.out.resolve()
    limit = int(args.minutes * 60)
    shim = torchvision_ops_shim(out / "tvops")
    ours = train_sl({"data.root": args.data.resolve(), "trainer.output_dir": out / "ours",
                     "trainer.validate_every": 0, "trainer.save_best": False,
                     "device": "cpu"}, "--nproc-per-node", "2")
    # lerobot trains in one process: as shipped, torch's intra-op threads span the cores
    # (ours: one thread in each of its processes, one process a core)
    threads = str(len(os.sched_getaffinity(0)))
    theirs = lerobot_command(args.venv, args.data.resolve(), out / "lerobot", 100_000, 50, [],
                             save_every=args.save_every)
    for name, command, env in (("ours", ours, bench_env()),
                               ("lerobot", theirs, bench_env(shim, HF_HUB_OFFLINE="1",
                                                             OMP_NUM_THREADS=threads))):
        bounded(command, out / f"{name}.log", env, limit)
    judging = argparse.Namespace(
        lerobot_run=out / "lerobot" / "checkpoints" / "last", data=args.data, ours=out / "ours",
        seed=args.seed, episodes=args.judge, batch=10, max_steps=400, out=out / "judge",
        venv=args.venv)
    if args.judge:
        judge(judging)
    else:
        print(f"trained {args.minutes} min each; judge with: python benchmarks/vs_lerobot.py "
              f"judge {judging.lerobot_run} --data {args.data} --ours {judging.ours} "
              f"--seed {args.seed} --episodes 50 --out {judging.out}")


def add_judge_commands(commands: argparse._SubParsersAction) -> None:
    j = commands.add_parser("judge", help="a lerobot checkpoint (and ours) on the test seeds")
    j.add_argument("lerobot_run", type=Path, help="lerobot's checkpoints/NNN (or last)")
    j.add_argument("--data", type=Path, required=True, help="the dataset it trained on")
    j.add_argument("--ours", type=Path, help="our run directory, judged on the same seeds")
    j.add_argument("--seed", type=int, default=200_000)
    j.add_argument("--episodes", type=int, default=50)
    j.add_argument("--batch", type=int, default=10, help="scenes stepped together")
    j.add_argument("--max-steps", type=int, default=400)
    j.add_argument("--out", type=Path, default=Path("/tmp/vs_lerobot_judge"))
    j.set_defaults(func=judge)
    child = commands.add_parser("judge-lerobot", help=argparse.SUPPRESS)
    for action in j._actions[1:]:
        if action.dest not in ("ours", "help"):
            child._add_action(action)
    child.set_defaults(func=judge_lerobot)
    a = commands.add_parser("as-shipped", help="each as it ships, equal wall-clock")
    a.add_argument("data", type=Path)
    a.add_argument("--minutes", type=float, default=45)
    a.add_argument("--save-every", type=int, default=100,
                   help="updates between lerobot's snapshots (~600 MB each); ours saves at "
                        "the limit")
    a.add_argument("--judge", type=int, default=0, metavar="EPISODES",
                   help="then judge both on this many test seeds (0: print the command)")
    a.add_argument("--seed", type=int, default=200_000, help="the first test seed")
    a.add_argument("--out", type=Path, default=Path("/tmp/vs_lerobot_shipped"))
    a.set_defaults(func=as_shipped)
