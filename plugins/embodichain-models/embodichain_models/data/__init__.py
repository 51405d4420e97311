"""Recorded robot data: the LeRobot format read and written (`lerobot/`) and the recorders of
the scripted demonstrations (`aloha/`, `cartpole/`)."""
