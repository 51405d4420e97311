"""The example recipes of embodichain-models, shipped as package data for `embodichain init`:
`nerd.yaml` (the NeRD dynamics model) and `cartpole_pixels.yaml` (cart-pole state from
pixels).

Registered under the entry-point group `embodichain.sl_recipes`. Imports nothing (no torch).
"""
