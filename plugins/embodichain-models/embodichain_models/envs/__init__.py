"""gymnasium environments of embodichain-models, registered when this module is imported
(a recipe's `evaluation.env.import: embodichain_models.envs`):

- `embodichain_models/CartPoleSwingUp-v0`: NeRD's cart-pole seen by a camera, to swing up
  and balance (the cart-pole behaviour-cloning recipe's closed loop;
  `embodichain_models.policies.cartpole_bc.env`).
"""

from __future__ import annotations

import gymnasium

CARTPOLE_SWING_UP = "embodichain_models/CartPoleSwingUp-v0"

if CARTPOLE_SWING_UP not in gymnasium.registry:
    gymnasium.register(CARTPOLE_SWING_UP,
                       entry_point="embodichain_models.policies.cartpole_bc.env:CartPoleSwingUp",
                       disable_env_checker=True)
