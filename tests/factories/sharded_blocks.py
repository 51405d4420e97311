"""A factory for the FSDP tests (design §13): named shard blocks, parameter groups and uneven
masks.

Named in recipes as `sharded_blocks:build_supervised_trainer` with tests/factories and
tests/scripts on PYTHONPATH. A 4 -> hidden -> hidden -> 2 MLP whose two hidden layers are
sharded as their own FSDP2 groups (`shard_blocks`; ignored under ddp); its first layer trains
at a tenth of the learning rate with its own weight decay; the corpus is sl_ddp's with every
example where x_2 > 0 unsupervised (tests/scripts/zero_weight_factory.py), so ranks carry
different weights and, with small batches, some updates have zero weight on one rank.
"""

from __future__ import annotations

from torch import nn
from zero_weight_factory import corpus

from embodichain.learning.sl import SupervisedTrainer, TensorSource
from embodichain.plugins import sl_ddp


def build_supervised_trainer(config, device):
    hidden = config.model.hidden
    model = nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, hidden + 3),
                          nn.Tanh(), nn.Linear(hidden + 3, 2))
    source = TensorSource(corpus(config.data.train_size, config.data.seed)).to(device)
    validation = {k: v.to(device) for k, v in corpus(256, 7).items()}

    def evaluate(model, device):
        return {"validation/mse": sl_ddp.masked_mse(model, validation).loss.item()}

    return SupervisedTrainer(
        config, model=model, source=source, objective=sl_ddp.masked_mse, device=device,
        evaluate=evaluate, shard_blocks=[model[0], model[2]],
        param_groups=[{"name": "first", "params": model[0].parameters(), "lr_scale": 0.1,
                       "weight_decay": 0.5}])


build_supervised_trainer.config_schema = sl_ddp.SlDdpConfig


def failing_shard_on_rank_one(config, device):
    """sl_ddp whose rank 1 cannot write files larger than 4 KiB from update 6 on (a full
    disk on that rank's node only): its next shard write fails with EFBIG."""
    import os
    import resource
    import signal

    trainer = sl_ddp.build_supervised_trainer(config, device)
    update = trainer.learner.update
    done = [0]

    def limited(*args, **kwargs):
        done[0] += 1
        if done[0] == 6 and os.environ.get("RANK") == "1":
            # update 4's shard may still be written in the background (a loaded machine):
            # the limit is for update 8's, so that one completes first
            trainer.checkpoints.settle()
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes then fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        return update(*args, **kwargs)

    trainer.learner.update = limited
    return trainer


failing_shard_on_rank_one.config_schema = sl_ddp.SlDdpConfig
