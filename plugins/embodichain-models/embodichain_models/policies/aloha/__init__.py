"""Bimanual ALOHA in MuJoCo (R-ALOHA-1): scripted experts record LeRobot v3.0 datasets
(`prepare.py`), an action-chunking transformer in the ACT style learns from them
(`model.py`, `sl_recipe.py`, factory `aloha_act`) and acts in gym-aloha's scenes through
the closed-loop evaluation (`execution.py`, `embodichain_models.envs.aloha`)."""
