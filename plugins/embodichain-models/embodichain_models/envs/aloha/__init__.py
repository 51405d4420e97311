"""gym-aloha's bimanual tasks as gymnasium environments that observe state without
rendering (`env.py`), their scenes (`scene.py`) and names (`tasks.py`).

Importing `embodichain_models.envs.aloha.env` (a recipe's `evaluation.env.import`)
registers `embodichain_models/AlohaTransferCube-v0` and `embodichain_models/AlohaInsertion-v0`
(400 steps). This package itself imports neither gymnasium nor the simulator.
"""
