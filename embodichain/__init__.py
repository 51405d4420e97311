"""embodichain: a supervised-learning training framework for PyTorch.

Importing this package is cheap on purpose: torch is only imported by the modules that
train, so the CLI starts instantly.
"""

__version__ = "0.1.0"
