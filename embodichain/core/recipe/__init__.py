"""Recipes: the framework schema, loading YAML with `--set` overrides, the error messages
that name the key at fault, and discovery of factories and packaged recipes by entry point.
Imports no other sub-package of `core`, and no torch."""
