"""Optimizer construction: hyper-parameters, `no_decay` and factory parameter groups (R-LOOP-3).

A factory may pass `param_groups`: a list of `{"params": [...], "lr_scale": s,
"weight_decay": d, "name": str}` (all but `params` optional). Parameters it does not list
form a last group named `default` with the recipe's settings. `optimizer.no_decay` then
splits each group into the parameters that decay and those exempted (`bias`: parameters
named `bias`; `norm`: parameters of normalisation layers), the latter with weight decay 0
whatever their group says. Each torch param group carries its `lr_scale`: its learning rate
is `optimizer.lr * lr_scale * schedule(step)`, so the schedule scales every group
proportionally, and the groups (with their names) are saved in the optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from embodichain.core.errors import UsageError
from embodichain.core.recipe.schema import OptimizerConfig

ParamGroups = Sequence[Mapping[str, Any]]
_GROUP_KEYS = {"params", "lr_scale", "weight_decay", "name"}
_NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
               nn.LayerNorm, nn.GroupNorm, nn.LocalResponseNorm, nn.RMSNorm)


def _is_norm(module: nn.Module) -> bool:
    # Custom normalisation layers are usually named so (e.g. `AdaLayerNorm`).
    return isinstance(module, _NORM_TYPES) or "Norm" in type(module).__name__


def exempt_parameters(model: nn.Module, no_decay: Iterable[str]) -> set[int]:
    """Ids of the parameters that `no_decay` exempts from weight decay."""
    kinds = set(no_decay)
    exempt: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if "bias" in kinds and name == "bias" or "norm" in kinds and _is_norm(module):
                exempt.add(id(param))
    return exempt


def build_param_groups(model: nn.Module, config: OptimizerConfig,
                       factory_groups: ParamGroups | None = None) -> list[dict[str, Any]]:
    """The torch param groups: the factory's, then `default`, each split by `no_decay`.

    A bad group is bad input (UsageError, exit 2, before anything starts): its values
    usually come from the recipe through the factory."""
    owned = dict.fromkeys(id(p) for p in model.parameters())
    groups, listed = [], set()
    for i, group in enumerate(factory_groups or ()):
        unknown = set(group) - _GROUP_KEYS
        if unknown or "params" not in group:
            raise _bad(i, group, f"keys are {sorted(_GROUP_KEYS)} (params required), got "
                       f"{sorted(group)}")
        params = list(group["params"])
        for p in params:
            if id(p) not in owned:
                raise _bad(i, group, "holds a tensor that is not a parameter of the model")
            if id(p) in listed:
                raise _bad(i, group, "repeats a parameter of an earlier group")
            listed.add(id(p))
        scale = _number(i, group, "lr_scale", group.get("lr_scale", 1.0))
        decay = _number(i, group, "weight_decay", group.get("weight_decay", config.weight_decay))
        if not scale > 0 or scale == float("inf"):
            raise _bad(i, group, f"lr_scale must be a finite number > 0 (the group's "
                       f"learning rate is optimizer.lr x lr_scale), got {scale}")
        if not decay >= 0 or decay == float("inf"):
            raise _bad(i, group, f"weight_decay must be a finite number >= 0, got {decay}")
        groups.append({"name": str(group.get("name", f"group{i}")), "params": params,
                       "lr_scale": scale, "weight_decay": decay})
    rest = [p for p in model.parameters() if id(p) not in listed]
    if rest:
        groups.append({"name": "default", "params": rest, "lr_scale": 1.0,
                       "weight_decay": config.weight_decay})
    exempt = exempt_parameters(model, config.no_decay)
    split = []
    for group in groups:
        decaying = [p for p in group["params"] if id(p) not in exempt]
        exempted = [p for p in group["params"] if id(p) in exempt]
        if decaying:
            split.append({**group, "params": decaying})
        if exempted:
            split.append({**group, "name": f"{group['name']}/no_decay", "params": exempted,
                          "weight_decay": 0.0})
    for group in split:
        group["lr"] = config.lr * group["lr_scale"]
    return split


def _bad(index: int, group: Mapping[str, Any], problem: str) -> UsageError:
    name = f" ({group['name']!r})" if isinstance(group.get("name"), str) else ""
    return UsageError(f"the factory's param_groups[{index}]{name}: {problem}. Nothing was "
                      "started.")


def build_optimizer(groups: list[dict[str, Any]], config: OptimizerConfig
                    ) -> torch.optim.Optimizer:
    """The recipe's optimizer over `groups`, with only the hyper-parameters it sets."""
    options: dict[str, Any] = {"lr": config.lr}
    if config.fused:  # absent otherwise: torch's default choice, as before the option
        options["fused"] = True
    if config.name in ("adam", "adamw"):
        if config.betas is not None:
            options["betas"] = tuple(config.betas)
        if config.eps is not None:
            options["eps"] = config.eps
        kind = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
        return kind(groups, **options)
    if config.momentum is not None:
        options["momentum"] = config.momentum
    return torch.optim.SGD(groups, nesterov=config.nesterov, **options)


def _number(index: int, group: Mapping[str, Any], key: str, value: Any) -> float:
    """A group's `key` as a float; anything but a real number is the factory's bad input."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(index, group, f"{key} must be a number, got {value!r}")
    return float(value)
