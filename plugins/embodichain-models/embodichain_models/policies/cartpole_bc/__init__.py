"""Cart-pole behaviour cloning from a LeRobot dataset: `prepare.py` records expert swing-up
demonstrations as LeRobot v3.0 (state, action, a rendered camera as mp4), `sl_recipe.py`
trains a small image-and-state policy on them and validates it closed-loop."""
