"""The swing-up task on NeRD's cart-pole (the physics is `dynamics/nerd/physics.py`): control
steps, starts, success and the task's expert (`task.py`), the camera (`render.py`) and the
gymnasium environment (`env.py`, registered by `embodichain_models.envs`)."""
