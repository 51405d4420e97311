"""Perception recipes: estimating a robot's state from camera frames."""
