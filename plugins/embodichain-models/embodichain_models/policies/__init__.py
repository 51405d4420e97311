"""Policies learned from recorded demonstrations."""
