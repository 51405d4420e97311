"""Public entry points of embodichain, grouped by learning paradigm."""
