"""The trained model of a checkpoint, rebuilt as its recipe's factory builds it.

A checkpoint holds weights, the resolved recipe and what the factory derived from its data
(`model_facts`), not the model's code: the factory named by the stored recipe builds the
model again from those facts, reading no data (on the CPU, one process, no compile; FSDP's
sharding is not applied; the recipe's evaluation environment not built, so no simulator is
needed; R-EVAL-5), and the checkpoint's weights (or EMA weights; a sharded checkpoint
consolidated, R-SHARD-4) are loaded into it strictly. A checkpoint written before the facts
were kept makes the factory read its data, as it did then.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from embodichain.core.checkpoint.export import NoEmaWeights, checkpoint_model
from embodichain.core.checkpoint.file import read_checkpoint
from embodichain.core.distributed import process_group
from embodichain.core.errors import UsageError
from embodichain.core.recipe.loading import for_world_size, validate_recipe
from embodichain.core.runs.elastic import without_derived_keys
from embodichain.core.training.model_facts import rebuilding_to_act, run_record


@dataclass
class TrainedModel:
    """A checkpoint's model with its weights, and the checkpoint's run record."""

    model: nn.Module
    run: dict[str, Any]
    step: int
    factory: str


def trained_model(checkpoint: Path, data: Mapping[str, Any] | None = None, *,
                  ema: bool = False) -> TrainedModel:
    """The model of `checkpoint` (`data`: its verified content, if already read) in eval
    mode on the CPU; UsageError when the recipe, its factory or the weights do not fit."""
    if data is None:
        data = read_checkpoint(checkpoint)
    run = dict(data["payload"]["run"])
    try:
        state = checkpoint_model(checkpoint, data, ema=ema)
    except NoEmaWeights as exc:
        raise UsageError(f"{exc}; export without --ema for the model's own weights") from None
    config = run.get("config")
    if not isinstance(config, Mapping):
        raise UsageError(f"{checkpoint} holds no recipe; it cannot be rebuilt")
    raw = copy.deepcopy(without_derived_keys(config))
    raw["device"] = "cpu"
    raw.pop("evaluation", None)  # its environment is not needed to rebuild the model
    trainer_section = raw.setdefault("trainer", {})
    trainer_section.update({"strategy": "ddp", "compile": False, "data_workers": 0,
                            "save_best": False, "early_stop": None,  # nothing validates
                            "activation_checkpointing": None})  # nor trains: no hooks
    trainer_section.pop("fsdp", None)
    with rebuilding_to_act(run_record(run)):  # the recipe's data need not be there
        recipe = for_world_size(validate_recipe(raw, source=f"{checkpoint} (stored recipe)"),
                                1)
    with process_group.distributed_run("cpu") as device, \
            rebuilding_to_act(run_record(run)):
        built = recipe.factory(recipe.config, device)
        try:
            model = getattr(built, "model", None)
            if not isinstance(model, nn.Module):
                raise UsageError(f"factory {recipe.config.factory} built no model to export")
            model = getattr(model, "_orig_mod", model)
            try:
                model.load_state_dict(state, strict=True)
            except RuntimeError as exc:
                raise UsageError(f"{checkpoint}: its weights do not fit the model factory "
                                 f"{recipe.config.factory} builds now: "
                                 f"{str(exc).splitlines()[0]}") from None
        finally:
            close = getattr(built, "close", None)
            if callable(close):
                close()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    # float32 whatever the training precision: the artifact's dtype (casts floating tensors)
    return TrainedModel(model.float(), run, int(data["manifest"]["step"]),
                        recipe.config.factory)
