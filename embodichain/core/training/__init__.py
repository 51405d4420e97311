"""Training: `SupervisedTrainer` and its fit loop (`trainer`), its snapshots
(`checkpointing`), the learner's weighted update (`learner`, `param_groups`, `precision`,
`ema`), how the model is spread over the ranks (`strategies`: ddp, fsdp, with `sharded_ema`),
the objective's `LossResult` (`objective`), how batches are drawn (`batches`), validation
callbacks (`callbacks`), the non-finite loss policy (`nonfinite`) and how a stopped fit
ends (`stops`)."""
