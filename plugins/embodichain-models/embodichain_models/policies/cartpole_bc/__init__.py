"""Cart-pole behaviour cloning from a LeRobot dataset (recorded by `data/cartpole/prepare.py`):
`sl_recipe.py` trains a small image-and-state policy (`policy.py`) on it and validates it
closed-loop in `envs/cartpole/`."""
