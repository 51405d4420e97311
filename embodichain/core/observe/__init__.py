"""What a user sees of a run: the progress bar and log lines (`progress`), the data's pace
(`pace`: examples/s, time waiting for data), the metric loggers (`loggers/`: metrics.jsonl,
TensorBoard, wandb, third-party ones), the end-of-run summary (`summary`) and `report`'s
plots (`report`)."""
