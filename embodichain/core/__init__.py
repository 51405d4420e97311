"""The common supervised-learning parts.

Import submodules directly: this package imports nothing, so the CLI stays fast.
"""
