"""What a user sees of a run: the progress bar and log lines, metric loggers (jsonl,
TensorBoard), the end-of-run summary and `report`'s plots."""
