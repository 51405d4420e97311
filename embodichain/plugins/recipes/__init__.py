"""Built-in example recipes, shipped as package data (`sl_ddp.yaml`).

Registered under the entry-point group `embodichain.sl_recipes` so that
`embodichain init sl_ddp FILE` works without a checkout. Imports nothing (no torch).
"""
