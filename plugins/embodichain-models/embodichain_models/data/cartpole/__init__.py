"""Cart-pole demonstrations: the swing-up expert's episodes recorded as a LeRobot v3.0 dataset
(`prepare.py`: `python -m embodichain_models.data.cartpole.prepare`)."""
