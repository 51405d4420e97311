"""Readers of recorded robot data (LeRobot datasets)."""
