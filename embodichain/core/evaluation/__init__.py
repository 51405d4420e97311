"""Closed-loop evaluation (R-EVAL-1..3): a factory's policy acting in gymnasium environments.

The recipe's `evaluation:` section names the environment and the episodes; the factory
gives the policy (`SupervisedTrainer(policy=..., success=...)`). Episode e runs on rank
e mod W, reset with seed `seed + e`, in one of the rank's environment slots (`slots`: in
this process, or one process each), one batched policy forward per step (`episodes`);
a fault ends its episode only. Rank 0 gathers the records, writes them with the videos
of the first episodes (`records`, `video`) and reports the metrics (`closed_loop`).
gymnasium is imported only here, and only when an evaluation is configured.
"""
