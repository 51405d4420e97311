"""Which logged keys measure the machine rather than the training: how long (`time/`) and
how much memory (`memory/`, R-OPS-3). They differ between runs that train identically, so
comparisons of training, the figures a snapshot keeps and the list of a run's metrics
leave them out."""

from __future__ import annotations

MEASURED_PREFIXES = ("time/", "memory/")


def is_measured(key: str) -> bool:
    """Whether `key` is a measurement of the machine (`time/...`, `memory/...`)."""
    return key.startswith(MEASURED_PREFIXES)
