"""`--nproc-per-node N`: start the workers through torch's elastic launcher (R-LAUNCH-1).

The same machinery as `torchrun --standalone --nproc-per-node=N --max-restarts=M -m
embodichain ...`: torchrun's own argument parsing builds the LaunchConfig and
`torch.distributed.launcher.api.elastic_launch` runs the workers, so restarts, rendezvous,
error files and the failure report are torchrun's. Nothing is launched under torchrun or for
N = 1: the command then runs in this process as usual.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from embodichain.core.errors import UsageError
from embodichain.core.runs.facts import SELF_LAUNCHED

LAUNCH_OPTIONS = ("--nproc-per-node", "--max-restarts")


def should_launch(nproc_per_node: int | None) -> bool:
    """Whether this process must start workers: N > 1 and not already a torchrun worker."""
    if nproc_per_node is None:
        return False
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node: expected a positive integer, got {nproc_per_node}")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    return nproc_per_node > 1 and not under_torchrun


def worker_arguments(argv: Sequence[str]) -> list[str]:
    """This command line without the launch options, for the workers to run."""
    out: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in LAUNCH_OPTIONS:
            skip_value = "=" not in arg
            continue
        out.append(arg)
    return out


def launch(nproc_per_node: int, max_restarts: int, argv: Sequence[str]) -> int:
    """Run `python -m embodichain ARGV` on N local workers; returns the exit code to use.

    0 when every worker succeeded; otherwise torchrun's failure report is printed (its root
    cause is the worker's own one-line message) and the code is torchrun's, 1, except 2 when
    every worker refused (bad input). A signal to
    this launcher is passed on to the workers, which stop with a snapshot (R-SIG-1); the
    launcher then exits 130 / 143 without a traceback.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    if max_restarts < 0:
        raise UsageError(f"--max-restarts: expected 0 or more, got {max_restarts}")
    args = parse_args(["--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}",
                       f"--max-restarts={max_restarts}", "-m", "embodichain",
                       *worker_arguments(argv)])
    # What torchrun's run() does for --standalone before building the config.
    import uuid

    args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, command, command_args = config_from_args(args)
    os.environ[SELF_LAUNCHED] = "1"  # the workers' messages then name this way to continue
    try:
        elastic_launch(config, command)(*command_args)
    except ChildFailedError as exc:
        print(exc.format_msg(), file=sys.stderr)
        # Every worker refused (bad input, exit 2): say so, as one process would.
        codes = {failure.exitcode for failure in exc.failures.values()}
        return 2 if codes == {2} else 1
    except SignalException as exc:
        return {2: 130, 15: 143}.get(int(exc.sigval), 1)
    return 0
