"""Training: `SupervisedTrainer` and its fit loop, the learner's weighted update, the
objective's `LossResult`, validation callbacks and the non-finite loss policy."""
