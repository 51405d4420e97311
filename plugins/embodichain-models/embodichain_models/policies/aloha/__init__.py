"""Bimanual ALOHA in MuJoCo (R-ALOHA-1): gym-aloha's scenes stepped without rendering
(`scene.py`) and as gymnasium environments (`env.py`, registered by `embodichain_models.envs`),
the tasks by name (`tasks.py`), ACT's scripted experts (`expert.py`) recording LeRobot v3.0
datasets (`record.py`, `prepare.py`), and an action-chunking transformer in the ACT style
(`model.py`, `sl_recipe.py`, factory `aloha_act`) acting through the closed-loop evaluation
(`execution.py`)."""
