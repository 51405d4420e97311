"""sl_ddp, whose build records what each worker sees of `trainer.deterministic`: the
environment variables it sets and torch's flags, in `$RECORD_DIR/rank<RANK>.json` (the build
fails without RECORD_DIR, so a test cannot read a stale record). Training is sl_ddp's, bitwise.

Named in recipes as `recording:build_supervised_trainer` with tests/factories on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from embodichain.plugins import sl_ddp

VARIABLES = ("CUBLAS_WORKSPACE_CONFIG", "NCCL_ALGO")


def build_supervised_trainer(config, device):
    record = Path(os.environ["RECORD_DIR"]) / f"rank{os.environ.get('RANK', '0')}.json"
    record.write_text(json.dumps({
        "env": {name: os.environ.get(name) for name in VARIABLES},
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "self_launched": bool(os.environ.get("EMBODICHAIN_SELF_LAUNCHED")),
    }))
    return sl_ddp.build_supervised_trainer(config, device)


build_supervised_trainer.config_schema = sl_ddp.build_supervised_trainer.config_schema
