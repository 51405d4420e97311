"""Forwarding only (move56-keep): ACT moved to `policies/act/`, the ALOHA simulator to
`envs/aloha/`, its recorder to `data/aloha/`. `prepare.py` here keeps the old command working."""
