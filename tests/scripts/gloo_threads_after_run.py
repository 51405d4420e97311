"""Under torchrun: train the example through the CLI's `app`, then print which gloo threads
are left in this worker (none may be: the process group must really be gone, R-PROC-2).

    torchrun --nproc-per-node=2 tests/scripts/gloo_threads_after_run.py OUTPUT_DIR
"""

import sys

from embodichain.cli import app
from embodichain.core.distributed.process_group import gloo_threads

app(["train-sl", "--config", "examples/learning/sl_ddp/cpu.yaml", "--set",
     f"trainer.output_dir={sys.argv[1]}", "--set", "trainer.max_updates=10", "--no-progress"],
    standalone_mode=False)
print(f"gloo threads left: {gloo_threads()}", flush=True)
