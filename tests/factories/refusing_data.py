"""Factories for the start-up refusal tests (tests/cli/test_cli_data_refusals.py): the
`sl_ddp` recipe whose factory first opens the LeRobot dataset named by
EMBODICHAIN_TEST_DATASET, as docs/lerobot.md's snippet does (`direct`: the reader's error let
through) or as a cautious factory does (`wrapped`: re-raised in its own RuntimeError, `from
exc`; `implicit`: raised in the `except` block without `from`, the reader's error its
context; `suppressed`: `from None`, the context hidden from the traceback only);
`bad_blocks` names a module outside the model in `shard_blocks`; `refuses` raises the
framework's UsageError at once.

With EMBODICHAIN_TEST_SLOW_EXIT_RANK=r, rank r's interpreter lingers 2 s at exit (as a
rank still shutting down its process group does when torchrun stops the others).

Each call appends `rank attempt` to EMBODICHAIN_TEST_ATTEMPTS (when set), so a test counts
how often the factory ran: once per rank and launch attempt.
"""

from __future__ import annotations

import os

from torch import nn

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


def _note_attempt() -> None:
    if os.environ.get("EMBODICHAIN_TEST_SLOW_EXIT_RANK") == os.environ.get("RANK", "0"):
        import atexit
        import time

        atexit.register(time.sleep, 2.0)
    path = os.environ.get("EMBODICHAIN_TEST_ATTEMPTS")
    if path:
        with open(path, "a") as f:
            f.write(f"{os.environ.get('RANK', '0')} "
                    f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}\n")


def _open_dataset() -> None:
    from embodichain_models.data.lerobot import lerobot_source

    lerobot_source(os.environ["EMBODICHAIN_TEST_DATASET"])


def direct(config, device):
    _note_attempt()
    _open_dataset()
    return sl_ddp.build_supervised_trainer(config, device)


def wrapped(config, device):
    _note_attempt()
    try:
        _open_dataset()
    except Exception as exc:
        raise RuntimeError("could not open the training data") from exc
    return sl_ddp.build_supervised_trainer(config, device)


def implicit(config, device):
    _note_attempt()
    try:
        _open_dataset()
    except Exception:
        raise RuntimeError("could not open the training data")  # noqa: B904 (the point)
    return sl_ddp.build_supervised_trainer(config, device)


def suppressed(config, device):
    _note_attempt()
    try:
        _open_dataset()
    except Exception:
        raise RuntimeError("could not open the training data") from None
    return sl_ddp.build_supervised_trainer(config, device)


def bad_blocks(config, device):
    model = sl_ddp.make_model(config.model.hidden)
    source = TensorSource(sl_ddp.make_corpus(config.data.train_size, config.data.seed))
    return SupervisedTrainer(config, model=model, source=source, objective=sl_ddp.masked_mse,
                             device=device, shard_blocks=[model[0], nn.Linear(2, 2)])


def refuses(config, device):
    from embodichain.core.errors import UsageError

    raise UsageError("data.train_size: refused by the test factory")


for _factory in (direct, wrapped, implicit, suppressed, bad_blocks, refuses):
    _factory.config_schema = sl_ddp.SlDdpConfig
