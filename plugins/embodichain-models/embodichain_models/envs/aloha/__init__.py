"""Bimanual ALOHA in MuJoCo (R-ALOHA-1), the benchmark's simulator: gym-aloha's scenes stepped
without rendering (`scene.py`) and as gymnasium environments (`env.py`, registered by
`embodichain_models.envs`), the tasks by name (`tasks.py`) and the episode's verdicts
(`judge.py`)."""
