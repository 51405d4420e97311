"""Closed-loop evaluation against a hand-written gymnasium loop (R-EVAL-1): episodes per second.

One process, a MuJoCo task (default HalfCheetah-v5: no early termination, so every episode
runs `--max-steps` steps and the figure is the per-step cost), the same policy on both sides
(a fixed-seed MLP, one batched torch forward per step), at 1, 4 and 8 environments, in this
process (`sync`: SyncVectorEnv in the loop) and one process each (`async`: AsyncVectorEnv).

- embodichain: `ClosedLoopEvaluation.run` as validation runs it: per-slot resets with the
  episode's own seed, fault checks (finite observations and rewards, the wall-clock limit),
  records; films off.
- hand-written: a gymnasium vector env of N copies, reset once with seeds, then stepped with
  autoreset until the same number of episodes has ended (no records, no fault checks).

The two alternate, `--pairs` times per setting; the ratio is embodichain / hand-written wall
time (lower is better; episodes per second of each are printed too). Needs
`pip install 'gymnasium[mujoco]'`.

    python benchmarks/evaluation.py --episodes 32 --max-steps 200 --pairs 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from embodichain.core.evaluation.closed_loop import ClosedLoopEvaluation
from embodichain.core.recipe.evaluation_schema import EvaluationConfig


def mlp(observations: int, actions: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(observations, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, actions), nn.Tanh()).eval()


class Policy:
    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model = model

    def reset(self, env_index: int) -> None:
        pass

    @torch.no_grad()
    def act(self, observations: np.ndarray) -> torch.Tensor:
        return self.model(torch.as_tensor(observations, dtype=torch.float32))


def framework(env_id: str, model: nn.Module, episodes: int, max_steps: int, envs: int,
              vector: str) -> float:
    config = EvaluationConfig.model_validate({
        "env": {"id": env_id}, "episodes": episodes, "seed": 0, "max_steps": max_steps,
        "envs_per_rank": envs, "vector": vector, "videos": 0})
    evaluation = ClosedLoopEvaluation(config, Policy)
    started = time.perf_counter()
    result = evaluation.run(model, torch.device("cpu"), lockstep=False)
    wall = time.perf_counter() - started
    assert result is not None and len(result.records) == episodes
    return wall


def hand_written(env_id: str, model: nn.Module, episodes: int, max_steps: int, envs: int,
                 vector: str) -> float:
    started = time.perf_counter()
    make = [lambda: gym.make(env_id, max_episode_steps=max_steps)] * envs
    venv = (gym.vector.AsyncVectorEnv(make) if vector == "async"
            else gym.vector.SyncVectorEnv(make))
    policy = Policy(model, torch.device("cpu"))
    obs, _ = venv.reset(seed=list(range(envs)))
    ended = 0
    while ended < episodes:
        obs, _, terminated, truncated, _ = venv.step(policy.act(obs).numpy())
        ended += int((terminated | truncated).sum())
    venv.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--vector", nargs="+", default=["sync", "async"])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    probe = gym.make(args.env)
    model = mlp(probe.observation_space.shape[0], probe.action_space.shape[0])
    probe.close()
    print(f"{args.env}: {args.episodes} episodes of {args.max_steps} steps, pairs "
          f"{args.pairs}, torch {torch.__version__}, gymnasium {gym.__version__}")
    print("| vector | envs | embodichain ep/s | hand-written ep/s | ratio (median) | range |")
    print("|--------|-----:|-----------------:|------------------:|---------------:|-------|")
    for vector in args.vector:
        for envs in args.envs:
            ours, theirs = [], []
            for _ in range(args.pairs):
                ours.append(framework(args.env, model, args.episodes, args.max_steps, envs,
                                      vector))
                theirs.append(hand_written(args.env, model, args.episodes, args.max_steps,
                                           envs, vector))
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            print(f"| {vector} | {envs} | {args.episodes / statistics.median(ours):.2f} | "
                  f"{args.episodes / statistics.median(theirs):.2f} | "
                  f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}–{max(ratios):.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
