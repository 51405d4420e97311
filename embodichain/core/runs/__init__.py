"""Run directories: run.json and metrics.jsonl (`run_dir`), the lock of a live run
(`run_lock`), the claim of a fresh one (`fresh_claim`), where a run starts and what it may
continue from (`resume_policy`, `snapshots`: which snapshot a directory means, `roll_back`),
the best-metric records (`best_record`), the `runs` table (`table`) and the commands that
continue a run (`commands`)."""
