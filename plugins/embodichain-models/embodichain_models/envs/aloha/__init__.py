"""gym-aloha's bimanual tasks as gymnasium environments that observe state without
rendering (`env.py`), their scenes (`scene.py`) and names (`tasks.py`).

Importing this package registers `embodichain_models/AlohaTransferCube-v0` and
`embodichain_models/AlohaInsertion-v0` (400 steps) when gymnasium is installed (the `[sim]`
extra); a recipe's `evaluation.env.import: embodichain_models.envs.aloha` does it.
"""

from __future__ import annotations

from embodichain_models.envs.aloha.tasks import EPISODE_STEPS, TASKS


def _register() -> None:
    try:
        from gymnasium.envs.registration import register, registry
    except ImportError:  # without [sim]: the ids are absent, the scene says what to install
        return
    for task in TASKS.values():
        if task.gym_id not in registry:
            register(id=task.gym_id, entry_point="embodichain_models.envs.aloha.env:AlohaEnv",
                     max_episode_steps=EPISODE_STEPS, kwargs={"task": task.name})


_register()
