"""Where a transfer-cube policy leaves the expert's path in closed loop: one episode of a
Diffusion Policy checkpoint beside the scripted expert's episode of the same seed.

    MUJOCO_GL=egl python benchmarks/closed_loop_trace.py CHECKPOINT SEED [SEED ...]
                        [--steps 400] [--every 20] [--execute 8 | --ensemble 0.01]
                        [--current all|joints]

Every `--every` steps: how far the policy's action and the scene's joints are from the
expert's target and joints at that step (mean and largest over the 14 joints, radians;
grippers 0-1), and at the end the highest reward reached. `--execute` overrides how many
actions of each sampled horizon are executed; `--ensemble M` samples a horizon every step
and acts ACT's temporal ensemble of them (weights exp(-M i)); `--current` feeds the current
frame as every history frame (`joints`: the joints only), to see whether the policy follows
the velocity the history shows. The EMA's weights act, as in the recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from embodichain.core.deploy.runner import Horizon, TemporalEnsemble
from embodichain.core.deploy.trained import trained_model


def main() -> None:
    import embodichain_models.envs  # noqa: F401  (registers the ids)
    import gymnasium
    from embodichain_models.data.aloha.record import Recorder
    from embodichain_models.envs.aloha.tasks import JOINT_NAMES, TASKS
    from embodichain_models.policies.diffusion.sl_recipe import make_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("seeds", type=int, nargs="+")
    parser.add_argument("--steps", type=int, default=400)
    execution = parser.add_mutually_exclusive_group()
    execution.add_argument("--execute", type=int, default=None)
    execution.add_argument("--ensemble", type=float, default=None)
    parser.add_argument("--current", choices=["all", "joints"], default=None)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()

    model = trained_model(args.checkpoint, ema=True).model.eval()
    env = gymnasium.make("embodichain_models/AlohaTransferCube-v0", task="transfer_cube",
                         obs_type="pixels_agent_pos", terminate_on_success=False)
    for seed in args.seeds:
        policy = make_policy(model, torch.device("cpu"))
        if args.execute:
            policy.execution = Horizon(args.execute, model.shape.horizon)
        if args.ensemble is not None:
            policy.execution = TemporalEnsemble(args.ensemble, model.shape.horizon)
        if args.current:
            policy.frames.push = current_only(policy.frames.push, args.current == "joints")
        print(f"seed {seed}", flush=True)
        trace(policy, env, Recorder(TASKS["transfer_cube"]).demonstrate(seed), seed,
              args.steps, args.every, JOINT_NAMES)


def current_only(push, joints_only: bool):
    """`Frames.push` whose histories repeat the current frame (the camera's too, unless
    `joints_only`): no velocity to read from them."""
    def push_current(arrays):
        histories = push(arrays)
        return [h if joints_only and a.dtype == np.uint8 else
                np.repeat(a[:, None], h.shape[1], axis=1)
                for a, h in zip(arrays, histories, strict=True)]
    return push_current


def trace(policy, env, expert, seed: int, steps: int, every: int, joint_names) -> None:
    obs, _ = env.reset(seed=seed)
    policy.reset(0)
    policy.seed_episode(0, seed)
    best = 0.0
    for t in range(steps):
        action = policy.act({"agent_pos": obs["agent_pos"][None],
                             "pixels": {"top": obs["pixels"]["top"][None]}})[0]
        if t % every == 0:
            off = np.abs(action - expert.targets[t])
            state = np.abs(obs["agent_pos"] - expert.state[t])
            print(f"t={t:3d}  action - expert: mean {off.mean():.3f}, max {off.max():.3f} "
                  f"({joint_names[off.argmax()]});  joints - expert's: mean "
                  f"{state.mean():.3f}, max {state.max():.3f} ({joint_names[state.argmax()]})",
                  flush=True)
        obs, reward, *_ = env.step(action)
        best = max(best, float(reward))
    print(f"highest reward: {best:g} (the expert's: {expert.rewards.max():g})")


if __name__ == "__main__":
    main()
