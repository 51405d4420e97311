"""A factory module that rank 1 fails to import, 5 s late: rank 0 is by then waiting in the
rendezvous for a worker that never joins (named `late_rank_one:build_supervised_trainer`)."""

from __future__ import annotations

import os
import time

from embodichain.plugins import sl_ddp

if os.environ.get("RANK") == "1":
    time.sleep(5)
    raise RuntimeError("simulated failure of rank 1 before it joins the group")

build_supervised_trainer = sl_ddp.build_supervised_trainer
