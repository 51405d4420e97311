"""`python -m counting_collectives ARGS...`: run `embodichain ARGS...` counting FSDP2's
reduce-scatters and its parameter groups, for tests/core/training/test_fsdp_parity.py.

FSDP2 (torch.distributed.fsdp._fully_shard._fsdp_collectives) reduce-scatters a group's
gradients with `torch.distributed.reduce_scatter_single`, looked up on the module at each
call; `reduce_scatter_tensor` is counted too, should a torch version use it instead. Each
`fully_shard` call makes one parameter group (it is wrapped before embodichain imports it).
Product code has no hooks: the wrapping is in this process only.

At exit every worker writes `$EMBODICHAIN_TEST_COUNTS_DIR/rank{R}.json`:
`{"reduce_scatters": N, "fsdp_groups": G}`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.fsdp as fsdp

COUNTS_ENV = "EMBODICHAIN_TEST_COUNTS_DIR"
counts = {"reduce_scatters": 0, "fsdp_groups": 0}


def _counted(real: Any, key: str) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return real(*args, **kwargs)

    return wrapper


dist.reduce_scatter_single = _counted(dist.reduce_scatter_single, "reduce_scatters")
dist.reduce_scatter_tensor = _counted(dist.reduce_scatter_tensor, "reduce_scatters")
fsdp.fully_shard = _counted(fsdp.fully_shard, "fsdp_groups")


def _write() -> None:
    directory = Path(os.environ[COUNTS_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(counts))


def main() -> None:
    from embodichain.cli import main as cli

    sys.argv = ["embodichain", *sys.argv[1:]]
    try:
        cli()
    finally:
        _write()


if __name__ == "__main__":
    main()
