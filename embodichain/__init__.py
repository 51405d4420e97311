"""embodichain: a supervised-learning training framework for PyTorch.

Importing this package is cheap on purpose: torch is only imported by the modules that
train, so the CLI starts instantly.
"""

__version__ = "0.1.0"
# The distribution that installs this package (`pip install embodichain-sl`), for metadata
# look-ups; the import package and the command stay `embodichain`. Not `embodichain`: on
# PyPI that name is another project (the EmbodiChain platform).
DISTRIBUTION = "embodichain-sl"
