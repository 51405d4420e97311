"""Factory discovery (entry points) and the built-in `sl_ddp` recipe."""
