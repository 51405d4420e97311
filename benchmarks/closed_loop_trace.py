"""Where a transfer-cube policy leaves the expert's path in closed loop: one episode of a
Diffusion Policy checkpoint beside the scripted expert's episode of the same seed.

    MUJOCO_GL=egl python benchmarks/closed_loop_trace.py CHECKPOINT SEED [--steps 400]
                                                        [--execute 8] [--every 20]

Every `--every` steps: how far the policy's action and the scene's joints are from the
expert's target and joints at that step (mean and largest over the 14 joints, radians;
grippers 0-1), and at the end the highest reward reached. `--execute` overrides how many
actions of each sampled horizon are executed. The EMA's weights act, as in the recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from embodichain.core.deploy.runner import Horizon
from embodichain.core.deploy.trained import trained_model


def main() -> None:
    import embodichain_models.envs  # noqa: F401  (registers the ids)
    import gymnasium
    from embodichain_models.data.aloha.record import Recorder
    from embodichain_models.envs.aloha.tasks import JOINT_NAMES, TASKS
    from embodichain_models.policies.diffusion.sl_recipe import make_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("seed", type=int)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--execute", type=int, default=None)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()

    expert = Recorder(TASKS["transfer_cube"]).demonstrate(args.seed)
    model = trained_model(args.checkpoint, ema=True).model.eval()
    policy = make_policy(model, torch.device("cpu"))
    if args.execute:
        policy.execution = Horizon(args.execute, model.shape.horizon)
    env = gymnasium.make("embodichain_models/AlohaTransferCube-v0", task="transfer_cube",
                         obs_type="pixels_agent_pos", terminate_on_success=False)
    obs, _ = env.reset(seed=args.seed)
    policy.reset(0)
    policy.seed_episode(0, args.seed)
    best = 0.0
    for t in range(args.steps):
        action = policy.act({"agent_pos": obs["agent_pos"][None],
                             "pixels": {"top": obs["pixels"]["top"][None]}})[0]
        if t % args.every == 0:
            off = np.abs(action - expert.targets[t])
            state = np.abs(obs["agent_pos"] - expert.state[t])
            print(f"t={t:3d}  action - expert: mean {off.mean():.3f}, max {off.max():.3f} "
                  f"({JOINT_NAMES[off.argmax()]});  joints - expert's: mean "
                  f"{state.mean():.3f}, max {state.max():.3f} ({JOINT_NAMES[state.argmax()]})",
                  flush=True)
        obs, reward, *_ = env.step(action)
        best = max(best, float(reward))
    print(f"highest reward: {best:g} (the expert's: {expert.rewards.max():g})")


if __name__ == "__main__":
    main()
