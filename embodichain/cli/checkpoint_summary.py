"""What `inspect-checkpoint` reports, as plain JSON-able data (R-INSP-1).

Built from the verified checkpoint dict alone: no recipe code is imported, so a checkpoint
can be inspected where its factory is not installed. Only `resume_check` (for `--config`)
loads a recipe, and it degrades to comparing the keys as written when the factory is
missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

# param_group entries that select an implementation, not the algorithm
_IMPLEMENTATION_KEYS = {"params", "foreach", "fused", "capturable", "differentiable"}


def summarize(data: Mapping[str, Any], path: Path, tensors: bool = False) -> dict[str, Any]:
    """The report for a checkpoint that `read_checkpoint` has loaded and verified."""
    from embodichain.core.checkpoint.formats import format_of
    from embodichain.core.recipe.schema import config_sha256

    manifest = data["manifest"]
    payload = data["payload"]
    run = _mapping(payload.get("run"))
    learner = _mapping(payload.get("learner"))
    config = run.get("config")
    ranks = _mapping(payload.get("ranks"))
    checkpoint_format = format_of(data)
    shards = None
    if checkpoint_format.keeps_parts:  # shards beside the manifest: read one at a time
        from embodichain.cli.sharded_summary import sharded_parts

        learner, ranks, shards = sharded_parts(data, path)
    buffer_names = {name for state in ranks.values() if isinstance(state, Mapping)
                    for name in _mapping(state.get("buffers"))}
    recipe_hash = config_sha256(config) if isinstance(config, Mapping) else None
    report = {
        "path": str(path),
        "file_bytes": path.stat().st_size,
        "format": manifest.get("format"),
        "format_version": manifest.get("format_version"),
        "payload_sha256": manifest.get("payload_sha256"),
        "digest_verified": True,  # read_checkpoint recomputed it, or it would have refused
        "run_id": manifest.get("run_id"),
        "created_at": run.get("created_at"),
        "step": manifest.get("step"),
        "world_size": manifest.get("world_size"),
        "strategy": checkpoint_format.written_by,
        "shards": shards,
        "factory": run.get("factory"),
        "config_sha256": manifest.get("config_sha256"),
        "config_matches_hash": recipe_hash == manifest.get("config_sha256"),
        "source_identity": run.get("source_identity"),
        "resumed_from": run.get("resumed_from"),
        "versions": dict(_mapping(run.get("versions"))),
        "model": model_summary(_mapping(learner.get("model")), buffer_names, tensors),
        "optimizer": optimizer_summary(learner, _mapping(config).get("optimizer")),
        "ema": ema_summary(learner, _mapping(_mapping(config).get("trainer")).get("ema")),
        "ranks": ranks_summary(ranks, manifest.get("world_size")),
        "callbacks": sorted(str(k) for k in _mapping(payload.get("callbacks"))),
        "metrics": dict(_mapping(run.get("metrics"))),
        "config": config,
    }
    return plain(report)


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def model_summary(state: Mapping[str, Any], buffer_names: set[str], tensors: bool
                  ) -> dict[str, Any]:
    """Parameter and buffer counts, bytes and dtypes of the (unwrapped) model state."""
    entries = [(name, t) for name, t in state.items() if isinstance(t, torch.Tensor)]
    params = [(n, t) for n, t in entries if n not in buffer_names]
    buffers = [(n, t) for n, t in entries if n in buffer_names]
    dtypes: dict[str, int] = {}
    for _, t in entries:
        dtypes[_dtype(t)] = dtypes.get(_dtype(t), 0) + t.numel()
    summary: dict[str, Any] = {
        "parameters": sum(t.numel() for _, t in params),
        "parameter_tensors": len(params),
        "buffers": sum(t.numel() for _, t in buffers),
        "buffer_tensors": len(buffers),
        "bytes": sum(_nbytes(t) for _, t in entries),
        "dtypes": dtypes,
    }
    if tensors:
        summary["tensors"] = [
            {"name": n, "kind": "buffer" if n in buffer_names else "parameter",
             "shape": list(t.shape), "dtype": _dtype(t), "numel": t.numel(),
             "bytes": _nbytes(t)}
            for n, t in entries
        ]
    return summary


def optimizer_summary(learner: Mapping[str, Any], recipe: Any) -> dict[str, Any]:
    """Optimizer type (inferred from its state), hyper-parameters and step; schedule, scaler."""
    opt = _mapping(learner.get("optimizer"))
    groups = [g for g in opt.get("param_groups") or [] if isinstance(g, Mapping)]
    states = [s for s in _mapping(opt.get("state")).values() if isinstance(s, Mapping)]
    steps = [int(s["step"]) for s in states if _is_number(s.get("step"))]
    state_tensors = [t for s in states for t in s.values() if isinstance(t, torch.Tensor)]
    scheduler = _mapping(learner.get("scheduler"))
    scaler = _mapping(learner.get("grad_scaler"))
    return {
        "type": infer_optimizer(groups, states),
        "recipe_name": _mapping(recipe).get("name"),
        "step": max(steps) if steps else None,
        "param_groups": len(groups),
        "parameter_tensors": sum(len(g.get("params") or []) for g in groups),
        "hyper_parameters": [{"parameter_tensors": len(g.get("params") or []),
                              **{k: v for k, v in g.items() if k not in _IMPLEMENTATION_KEYS}}
                             for g in groups],
        "state_tensors": len(state_tensors),
        "state_bytes": sum(_nbytes(t) for t in state_tensors),
        "scheduler": {"last_epoch": scheduler.get("last_epoch"),
                      "last_lr": scheduler.get("_last_lr")} if scheduler else None,
        "grad_scaler": ({"enabled": True, "scale": scaler.get("scale"),
                         "growth_tracker": scaler.get("_growth_tracker")}
                        if scaler else {"enabled": False}),
    }


def ema_summary(learner: Mapping[str, Any], recipe: Any) -> dict[str, Any] | None:
    """The EMA weights (`learner.ema`, R-LOOP-2): decay, what validation uses, size."""
    state = learner.get("ema")
    if not isinstance(state, Mapping):
        return None
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor)]
    return {"decay": _mapping(recipe).get("decay"), "validate": _mapping(recipe).get("validate"),
            "tensors": len(tensors), "bytes": sum(_nbytes(t) for t in tensors)}


def _is_number(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1
    return isinstance(value, int | float) and not isinstance(value, bool)


def infer_optimizer(groups: Sequence[Mapping[str, Any]],
                    states: Sequence[Mapping[str, Any]]) -> str:
    """The torch.optim class that wrote this state, from its state and param_group keys."""
    state_keys = {k for s in states for k in s}
    group_keys = {k for g in groups for k in g}
    first = groups[0] if groups else {}
    if {"exp_avg", "exp_avg_sq"} <= state_keys or {"betas", "amsgrad"} <= group_keys:
        if "mu_product" in state_keys:
            return "NAdam"
        if "amsgrad" not in group_keys:
            return "RAdam"
        # torch >= 2.6 stores this flag; AdamW is Adam with decoupled weight decay
        if first.get("decoupled_weight_decay"):
            return "AdamW"
        return "Adam" if "decoupled_weight_decay" in group_keys else "Adam or AdamW"
    if "exp_inf" in state_keys:
        return "Adamax"
    if "acc_delta" in state_keys:
        return "Adadelta"
    if "square_avg" in state_keys or "alpha" in group_keys and "centered" in group_keys:
        return "RMSprop"
    if "sum" in state_keys or "lr_decay" in group_keys:
        return "Adagrad"
    if "momentum_buffer" in state_keys or {"momentum", "dampening", "nesterov"} <= group_keys:
        return "SGD"
    return "unknown"


def ranks_summary(ranks: Mapping[Any, Any], world_size: Any) -> dict[str, Any]:
    """Which per-rank states the checkpoint holds, and whether every rank is there."""
    per_rank = {}
    for rank in sorted(ranks, key=lambda r: (not isinstance(r, int), str(r))):
        state = _mapping(ranks[rank])
        rng = _mapping(state.get("rng"))
        sampler = _mapping(state.get("sampler"))
        per_rank[str(rank)] = {
            "torch_rng": isinstance(rng.get("torch_cpu"), torch.Tensor),
            "cuda_rng": rng.get("cuda") is not None,
            "python_rng": rng.get("python") is not None,
            "numpy_rng": rng.get("numpy") is not None,
            "sampler": ({k: sampler.get(k) for k in ("batches_drawn", "batch_size",
                                                     "corpus_size") if k in sampler}
                        if sampler else None),
            "buffers": len(_mapping(state.get("buffers"))),
        }
    present = {r for r in ranks if isinstance(r, int)}
    expected = set(range(world_size)) if isinstance(world_size, int) else set()
    return {
        "present": len(ranks),
        "complete": bool(expected) and present == expected and len(ranks) == len(expected),
        "missing": sorted(expected - present),
        "extra": sorted(str(r) for r in ranks if r not in expected),
        "per_rank": per_rank,
    }


def plain(value: Any) -> Any:
    """JSON-able copy: tensors to numbers/lists, tuples to lists, non-finite floats to text.

    Strict JSON has no NaN or Infinity; a skipped update's loss can be NaN, so those become
    the strings "NaN", "Infinity", "-Infinity".
    """
    if isinstance(value, torch.Tensor):
        return plain(value.item() if value.numel() == 1 else value.tolist())
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# ----------------------------------------------------------------------------------------
# May this recipe resume from the checkpoint?


def resume_check(data: Mapping[str, Any], checkpoint: Path, recipe_path: Path,
                 overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Whether `recipe_path` may resume from the checkpoint, by the rules of R-RESUME-2..5.

    The recipe is validated and resolved when its factory imports here; otherwise its
    framework sections are resolved and the factory's sections compared as written. World
    size and data identity can only be checked at launch, so they are stated as conditions.
    """
    from embodichain.core.errors import ConfigError
    from embodichain.core.recipe.loading import (
        check_recipe,
        read_recipe_file,
        resolve_framework_part,
    )
    from embodichain.core.recipe.schema import flatten_keys
    from embodichain.core.runs.config_compat import (
        config_differences,
        keys_at_default,
        moved,
        with_keys,
    )
    from embodichain.core.runs.elastic import continues_on_any_world_size
    from embodichain.core.runs.resume_record import added_note

    run = _mapping(data["payload"].get("run"))
    step = int(data["manifest"]["step"])
    saved = _mapping(run.get("config"))
    result: dict[str, Any] = {"recipe": str(recipe_path), "compatible": False,
                              "compared": "resolved recipe", "note": None, "problems": [],
                              "differences": [], "conditions": []}
    # A recipe that cannot be read raises ConfigError: bad input (exit 2), not a verdict.
    checked = check_recipe(read_recipe_file(recipe_path), str(recipe_path), overrides)
    if checked.recipe is not None:
        current = checked.recipe.resolved
    elif checked.factory_problem is not None and checked.problems == [
            f"factory: {checked.factory_problem}"]:
        # Only the factory is missing here (e.g. inspecting on another machine).
        try:
            current = resolve_framework_part(checked.raw)
        except ConfigError as exc:  # pragma: no cover - framework problems are listed above
            result["problems"] = [f"the recipe is invalid: {p}" for p in exc.problems]
            return result
        result["compared"] = "recipe as written"
        result["note"] = (f"the recipe's factory cannot be loaded here ({checked.factory_problem});"
                          " its framework sections were resolved, its own sections compared "
                          "as written, without the factory's defaults")
        # A key the checkpoint has but the file omits may just be a default: not comparable.
        framework = set(_framework_keys())
        written = flatten_keys(current)
        saved = {k: v for k, v in flatten_keys(saved).items()
                 if k.split(".")[0] in framework or k in written}
        saved = with_keys({}, saved)  # nested again
    else:  # an invalid recipe is bad input too, reported as validate-config would
        raise ConfigError(checked.problems, str(recipe_path))
    # The recipe's own schema decides keys newer than the checkpoint, as at launch.
    schema = type(checked.recipe.config) if checked.recipe is not None else None
    result["differences"] = config_differences(saved, current, step, schema, same_source=True)
    added = keys_at_default(saved, current, schema)  # the same, spelled out now (R-PREEMPT-3)
    if added:
        result["added"] = added_note(added)
    moves = moved(saved, current, schema)
    result["problems"] += _destination_problems(current, checkpoint, run, step)
    world_size = data["manifest"].get("world_size")
    elastic = continues_on_any_world_size(saved, current)
    if elastic:
        result["world_sizes"] = world_sizes_that_divide(current)
    result["conditions"] = [
        _world_size_condition(world_size, result.get("world_sizes"), current) if elastic else
        (f"launch with {world_size} workers (torchrun --nproc-per-node={world_size}, or "
         f"--nproc-per-node {world_size})" if isinstance(world_size, int) and world_size > 1
         else "launch one process, without torchrun") + "; exact recovery needs the "
        "checkpoint's world size (or trainer.global_batch_size in both recipes)",
        f"the factory's data must have source identity {run.get('source_identity')} "
        "(checked at launch)" + ("; so may the data have moved: " + "; ".join(
            f"{k}: {a} -> {b}" for k, (a, b) in sorted(moves.items())) if moves else ""),
    ]
    if result["differences"] or result["problems"]:
        result["compatible"] = False
    else:
        result["compatible"] = True if checked.recipe is not None else None
    return result


def world_sizes_that_divide(config: Mapping[str, Any]) -> list[int]:
    """The world sizes on which recipe `config` (with trainer.global_batch_size G) runs:
    those W for which G / (W x batch_size) is a whole number."""
    trainer = _mapping(config.get("trainer"))
    g, b = int(trainer["global_batch_size"]), int(trainer.get("batch_size") or 1)
    return [w for w in range(1, g // b + 1) if g % (w * b) == 0]


def _world_size_condition(saved: Any, sizes: Sequence[int] | None,
                          config: Mapping[str, Any]) -> str:
    b = _mapping(config.get("trainer")).get("batch_size")
    listed = ", ".join(str(w) for w in sizes or ())
    return (f"launch with any of {listed} workers (trainer.global_batch_size: the checkpoint's "
            f"{saved} or another; other world sizes with another trainer.batch_size than "
            f"{b}); only the same world size continues bitwise")


def _framework_keys() -> list[str]:
    from embodichain.core.recipe.schema import FrameworkConfig

    return list(FrameworkConfig.model_fields)


def _destination_problems(current: Mapping[str, Any], checkpoint: Path,
                          run: Mapping[str, Any], step: int) -> list[str]:
    """The output-directory rules: a fresh directory, or in place under R-RESUME-4/5."""
    from embodichain.core.runs.resume_policy import in_place_problem
    from embodichain.core.runs.run_dir import artifacts_in

    output_dir = _mapping(current.get("trainer")).get("output_dir")
    if not isinstance(output_dir, str):
        return []
    directory = Path(output_dir)
    if directory.is_dir() and directory.resolve() == checkpoint.parent.resolve():
        try:
            problem = in_place_problem(checkpoint, run.get("run_id"), step, directory)
        except Exception as exc:  # unreadable run.json: say so rather than crash
            return [str(exc)]
        if problem is None:
            return []
        return [f"trainer.output_dir is the checkpoint's own directory, but {problem}: resume "
                "into a fresh directory (--set trainer.output_dir=...)"]
    if directory.exists() and not directory.is_dir():
        return [f"trainer.output_dir {directory} exists and is not a directory"]
    found = artifacts_in(directory)
    if found:
        return [f"trainer.output_dir {directory} already holds a run ({', '.join(found[:5])}); "
                "resume into an artifact-free directory (--set trainer.output_dir=...)"]
    return []
