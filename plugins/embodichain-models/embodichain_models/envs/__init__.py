"""gymnasium environments of embodichain-models, registered when this module is imported
(a recipe's `evaluation.env.import: embodichain_models.envs`):

- `embodichain_models/CartPoleSwingUp-v0`: NeRD's cart-pole seen by a camera, to swing up
  and balance (the cart-pole behaviour-cloning recipe's closed loop;
  `embodichain_models.envs.cartpole.env`).
- `embodichain_models/AlohaTransferCube-v0`, `embodichain_models/AlohaInsertion-v0`:
  gym-aloha's bimanual MuJoCo scenes observing state, rendering only on request (400 steps;
  `embodichain_models.envs.aloha.env`, needs the `[sim]` extra to be built).

The simulators themselves are the packages beside this module (`aloha/`, `cartpole/`). Importing
one of them runs this module first, which is why it registers only where gymnasium is
installed: the recipes' torch-free schemas read the ALOHA tasks without the `[sim]` extra.
"""

from __future__ import annotations

from embodichain_models.envs.aloha.tasks import EPISODE_STEPS, TASKS

try:
    import gymnasium
except ModuleNotFoundError:  # no environment can be made without it: nothing to register
    gymnasium = None  # type: ignore[assignment]

CARTPOLE_SWING_UP = "embodichain_models/CartPoleSwingUp-v0"
ALOHA = "embodichain_models.envs.aloha.env:AlohaEnv"

if gymnasium is not None and CARTPOLE_SWING_UP not in gymnasium.registry:
    gymnasium.register(CARTPOLE_SWING_UP,
                       entry_point="embodichain_models.envs.cartpole.env:CartPoleSwingUp",
                       disable_env_checker=True)

for _task in TASKS.values() if gymnasium is not None else ():
    if _task.gym_id not in gymnasium.registry:
        gymnasium.register(_task.gym_id, entry_point=ALOHA, max_episode_steps=EPISODE_STEPS,
                           kwargs={"task": _task.name})
