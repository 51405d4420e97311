"""gymnasium environments of embodichain-models, registered when this module is imported
(a recipe's `evaluation.env.import: embodichain_models.envs`):

- `embodichain_models/CartPoleSwingUp-v0`: NeRD's cart-pole seen by a camera, to swing up
  and balance (the cart-pole behaviour-cloning recipe's closed loop;
  `embodichain_models.policies.cartpole_bc.env`).
- `embodichain_models/AlohaTransferCube-v0`, `embodichain_models/AlohaInsertion-v0`:
  gym-aloha's bimanual MuJoCo scenes observing state, rendering only on request (400 steps;
  `embodichain_models.policies.aloha.env`, needs the `[sim]` extra to be built).
"""

from __future__ import annotations

import gymnasium

from embodichain_models.policies.aloha.tasks import EPISODE_STEPS, TASKS

CARTPOLE_SWING_UP = "embodichain_models/CartPoleSwingUp-v0"
ALOHA = "embodichain_models.policies.aloha.env:AlohaEnv"

if CARTPOLE_SWING_UP not in gymnasium.registry:
    gymnasium.register(CARTPOLE_SWING_UP,
                       entry_point="embodichain_models.policies.cartpole_bc.env:CartPoleSwingUp",
                       disable_env_checker=True)

for _task in TASKS.values():
    if _task.gym_id not in gymnasium.registry:
        gymnasium.register(_task.gym_id, entry_point=ALOHA, max_episode_steps=EPISODE_STEPS,
                           kwargs={"task": _task.name})
