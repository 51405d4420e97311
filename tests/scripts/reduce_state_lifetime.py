"""Under torchrun: on which thread does DDP's reduce state, which holds the process group,
die after `Learner.release()`? Prints one line per rank: `freed on other threads: K of N`.

    torchrun --nproc-per-node=2 -m reduce_state_lifetime

Every worker pins itself to one CPU, so that gloo's worker thread, which runs the
communication hook's future callback, is often descheduled before it lets go of the callback
(as on a loaded machine). Were that callback to hold the state, the state (and, after
`destroy_process_group`, the group) would often die on that thread, whose destructor then
joins itself: SIGABRT, "Resource deadlock avoided".
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import torch

from embodichain.core.data.micro_batches import MicroBatches
from embodichain.core.recipe.schema import OptimizerConfig
from embodichain.learning.sl import Learner, distributed_run
from embodichain.plugins import sl_ddp

ROUNDS = 30


def main() -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    torch.set_num_threads(1)
    main_thread = threading.get_ident()
    freed_on: list[bool] = []  # per round: freed on another thread than the main one
    x, y = torch.randn(8, 4), torch.randn(8, 2)

    def gather(indices: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"x": x[indices], "y": y[indices], "mask": torch.ones(len(indices), 2)}

    with distributed_run("cpu") as device:
        for _ in range(ROUNDS):
            learner = Learner(sl_ddp.make_model(hidden=8), OptimizerConfig(name="sgd", lr=0.1),
                              None, 10, device)
            weakref.finalize(learner.strategy._reduce,
                             lambda: freed_on.append(threading.get_ident() != main_thread))
            learner.update(sl_ddp.masked_mse, MicroBatches(torch.arange(8), 8, gather))
            learner.release()
            del learner
    time.sleep(0.2)  # GIL released: a callback still held elsewhere is dropped now
    print(f"rank {os.environ['RANK']}: freed on other threads: {sum(freed_on)} of "
          f"{len(freed_on)}", flush=True)


if __name__ == "__main__":
    main()
