"""`--nproc-per-node N`: start the workers through torch's elastic launcher (R-LAUNCH-1).

The same machinery as `torchrun --standalone --nproc-per-node=N -m embodichain ...`:
torchrun's own argument parsing builds the LaunchConfig and
`torch.distributed.launcher.api.elastic_launch` runs the workers, so rendezvous, error files
and the failure report are torchrun's. Nothing is launched under torchrun or for N = 1: the
command then runs in this process as usual.

The workers' command line is built from the parsed command (`worker_command`), not from
`sys.argv`, so the command can be driven through `app([...])` or a CliRunner.

`--max-restarts M` restarts every worker after a failure, up to M times, as torchrun does,
but a refusal is final (R-PROC-3): when the workers refused (bad input, exit 2) the same
input would be refused again, so it is printed once and the launcher exits 2. That is why
the attempts are this module's loop around `elastic_launch` (each with no restart of its
own, a fresh rendezvous and store) rather than torch's, which retries every failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from embodichain.core.errors import UsageError
from embodichain.core.runs.commands import SELF_LAUNCHED

REFUSED = 2  # a worker's exit code for bad input (UsageError)
ran_an_agent = False  # whether this process ran torch's elastic agent (see cli.main)


def should_launch(nproc_per_node: int | None) -> bool:
    """Whether this process must start workers: N > 1 and not already a torchrun worker."""
    if nproc_per_node is None:
        return False
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node: expected a positive integer, got {nproc_per_node}")
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    return nproc_per_node > 1 and not under_torchrun


def worker_command(command: str, options: Sequence[tuple[str, object]],
                   arguments: Sequence[str] = ()) -> list[str]:
    """`COMMAND [ARGUMENTS] [OPTIONS]` for the workers, from parsed values: each option is a
    `(flag, value)` pair; a list repeats the flag, True gives the bare flag, None / False
    leave it out."""
    out = [command, *arguments]
    for flag, value in options:
        values = value if isinstance(value, list | tuple) else [value]
        for item in values:
            if item is True:
                out.append(flag)
            elif item is not None and item is not False:
                out += [flag, str(item)]
    return out


def launch(nproc_per_node: int, max_restarts: int, worker_args: Sequence[str]) -> int:
    """Run `python -m embodichain WORKER_ARGS` on N local workers; returns the exit code.

    0 when every worker succeeded; otherwise torchrun's failure report is printed (its root
    cause is the worker's own one-line message) and the code is torchrun's, 1, except 2 when
    the workers refused (bad input; never retried). A signal to this launcher is passed on
    to the workers, which stop with a snapshot (R-SIG-1); the launcher then exits 130 / 143
    without a traceback.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if max_restarts < 0:
        raise UsageError(f"--max-restarts: expected 0 or more, got {max_restarts}")
    global ran_an_agent
    ran_an_agent = True
    os.environ[SELF_LAUNCHED] = "1"  # the workers' messages then name this way to continue
    for attempt in range(max_restarts + 1):
        try:
            _launch_once(nproc_per_node, worker_args)
            return 0
        except ChildFailedError as exc:
            codes = {failure.exitcode for failure in exc.failures.values()}
            if REFUSED in codes or attempt == max_restarts:
                print(exc.format_msg(), file=sys.stderr)
                # The workers refused (bad input, exit 2): say so, as one process would.
                return REFUSED if codes == {REFUSED} else 1
            print(f"worker(s) failed (exit {', '.join(map(str, sorted(codes)))}); restarting "
                  f"all {nproc_per_node} workers ({max_restarts - attempt} of {max_restarts} "
                  "restarts left)", file=sys.stderr, flush=True)
        except Exception as exc:
            stop = _signal_behind(exc, SignalException)
            if stop is None:
                raise
            return {2: 130, 15: 143}.get(int(stop.sigval), 1)
    raise AssertionError("unreachable")


def _signal_behind(exc: BaseException, signal_exception: type) -> BaseException | None:
    """The agent's SignalException that `exc` is or was raised while handling.

    torch raises it from a signal handler, so it can land anywhere, e.g. in the
    `metrics.prof` wrapper between its `try:` and `start = time.time()`, whose `finally`
    then raises UnboundLocalError instead: the stop is still a stop (seen in CI)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, signal_exception):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _launch_once(nproc_per_node: int, worker_args: Sequence[str]) -> None:
    """One attempt: what `torchrun --standalone --nnodes=1 --nproc-per-node=N
    --max-restarts=0 -m embodichain WORKER_ARGS` does."""
    import uuid

    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    args = parse_args(["--standalone", "--nnodes=1", f"--nproc-per-node={nproc_per_node}",
                       "--max-restarts=0", "-m", "embodichain", *worker_args])
    # What torchrun's run() does for --standalone before building the config.
    args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    config, command, command_args = config_from_args(args)
    elastic_launch(config, command)(*command_args)
