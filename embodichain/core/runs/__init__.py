"""Run directories: run.json and metrics.jsonl, the lock of a live run, where a run starts
and what it may continue from (resume policy, snapshots, roll-back), the `runs` table, and
facts read back from a directory (its snapshots, the command that continues it)."""
