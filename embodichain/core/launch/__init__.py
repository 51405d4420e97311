"""Launching: running a recipe on every rank from the CLI (`train`: build, fit, summary),
how a run starts (`start`: rank 0 decides, every rank learns it and receives its part of a
snapshot), the programmatic API (`api`) and self-launching workers through torch's elastic
launcher (`self_launch`). The top layer: it may import every other sub-package, and none
imports it."""
