"""ACT, the action-chunking transformer (R-ALOHA-1): the network and its loss (`model.py`), the
recipe's schema (`schema.py`), its samples from a LeRobot dataset (`data.py`), how a chunk is
executed in closed loop (`execution.py`) and the recipe itself (`sl_recipe.py`, factory
`aloha_act`). Its camera backbone is `policies/vision/backbone.py`; the environment it acts in
is `envs/aloha/`, the demonstrations it learns from are recorded by `data/aloha/`."""
