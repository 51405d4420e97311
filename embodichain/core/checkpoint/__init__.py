"""Checkpoint files: their names (`names`: last.pt, best.pt, step files, ordered by step),
the self-verifying format with its atomic write and safe load (`file`), a manifest read
without torch (`manifest`), the background writer and save clock (`writer`), each rank's
restorable state (`rank_state`: RNG streams, buffers), the disk-space plan (`disk_plan`)
and the export of a model's weights (`export`)."""
