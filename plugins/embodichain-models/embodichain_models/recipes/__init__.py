"""The NeRD example recipe, shipped as package data (`nerd.yaml`) for `embodichain init nerd`.

Registered under the entry-point group `embodichain.sl_recipes`. Imports nothing (no torch).
"""
