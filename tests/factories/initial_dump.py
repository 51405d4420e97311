"""sl_ddp, whose build writes the model's weights as the run starts them (after the factory,
the Learner and its strategy: a sharded model gathered whole) to
`$INIT_DUMP_DIR/rank<RANK>.pt` (and in `rank<RANK>.counts` the elements it received point
to point while it was built, and those of its own model or shard), so a test can compare
them bitwise with the weights `--init-from` named. `INIT_EXTRA_HEAD=1` appends a layer
(`3.weight`, `3.bias`): a model with tensors a plain sl_ddp checkpoint lacks;
`INIT_HEAD_WIDTH=N` makes that head two layers through N units (`3.weight` (N, 2) ...
`4.bias`): a resized head. Without these variables, training is sl_ddp's.

Named in recipes as `initial_dump:build_supervised_trainer` with tests/factories on
PYTHONPATH.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from embodichain.plugins import sl_ddp


def _counting_receives() -> list[int]:
    """Count the elements this rank receives point to point (dist.recv) while it builds."""
    import torch.distributed as dist

    counted, plain = [0], dist.recv

    def recv(tensor, *args, **kwargs):
        counted[0] += tensor.numel()
        return plain(tensor, *args, **kwargs)

    dist.recv = recv
    return counted


def build_supervised_trainer(config, device):
    received = _counting_receives() if os.environ.get("INIT_DUMP_DIR") else None
    if os.environ.get("INIT_EXTRA_HEAD"):
        plain = sl_ddp.make_model
        width = int(os.environ.get("INIT_HEAD_WIDTH", "0"))
        extra = [nn.Linear(2, width), nn.Linear(width, 2)] if width else [nn.Linear(2, 2)]
        sl_ddp.make_model = lambda hidden: nn.Sequential(*plain(hidden), *extra)
        try:
            trainer = sl_ddp.build_supervised_trainer(config, device)
        finally:
            sl_ddp.make_model = plain
    else:
        trainer = sl_ddp.build_supervised_trainer(config, device)
    if os.environ.get("INIT_DUMP_DIR"):
        from torch.distributed.tensor import DTensor

        whole = {name: (value.full_tensor() if isinstance(value, DTensor) else value).clone()
                 for name, value in trainer.learner.model.state_dict().items()}
        path = Path(os.environ["INIT_DUMP_DIR"]) / f"rank{os.environ.get('RANK', '0')}.pt"
        torch.save(whole, path)
        own = sum((v.to_local() if isinstance(v, DTensor) else v).numel()
                  for v in trainer.learner.model.state_dict().values())
        path.with_suffix(".counts").write_text(f"{received[0]} {own}")
    return trainer


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
