"""Running on several processes: `distributed_run` (the process group), the framework's own
collectives, and the stop request that rides on the update's all-reduce (signals)."""
