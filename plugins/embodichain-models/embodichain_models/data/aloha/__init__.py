"""ALOHA demonstrations: ACT's scripted experts (`expert.py`) recorded in the benchmark's scenes
(`record.py`) as LeRobot v3.0 datasets (`prepare.py`:
`python -m embodichain_models.data.aloha.prepare`)."""
