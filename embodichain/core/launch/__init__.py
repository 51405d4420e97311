"""Launching: running a recipe on every rank from the CLI (start, fit, summary) and
self-launching workers through torch's elastic launcher. The top layer: it may import
every other sub-package, and none imports it."""
