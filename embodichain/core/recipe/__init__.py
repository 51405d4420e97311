"""Recipes: the framework schema (`schema`, `limits`), loading YAML with `--set` overrides
(`loading`), validation errors that name the key at fault (`validation_errors`), the best
metric (`best`), logger names (`logger_names`), and discovery of factories and packaged
recipes by entry point (`discovery`, `packaged`). Imports no other sub-package of `core`,
and no torch."""
