"""Checkpoint files: the self-verifying format with its atomic write and safe load, each
rank's restorable state (RNG streams, sampler, buffers) and the disk-space plan."""
