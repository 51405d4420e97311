"""The interface an artifact carries: what the model's `interface()` declares, checked and
put in the one form runners read, plus where the weights came from (provenance).

The form (format 1) is the one `embodichain.core.deploy.runner` documents: `kind`,
`observations` {key: {shape, dtype, meaning}}, `action` {key, shape, dtype, meaning}, `fps`,
`chunk`, `execution` ({"horizon": h} or {"temporal_ensemble": m}) and `provenance`.
Shapes are one example's (no batch dimension); an observation with `stack: n` is one step's
(`shape`), of which the model takes the last n (`[n, *shape]`). A model that samples takes
its starting noise as a last input, declared as `noise` {key, shape, dtype float32, and the
runner's NOISE_RULE}: the runner draws it by that rule (format 2, written only then).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
from collections.abc import Mapping
from typing import Any

from embodichain.core.deploy.runner import NOISE_RULE
from embodichain.core.errors import UsageError

FORMAT = 1
NOISE_FORMAT = 2  # an interface with `noise`: a format 1 runner cannot draw it
INTERFACE_KEY = "embodichain.interface"  # ONNX metadata_props entry (the runner's name too)
PT2_INTERFACE_FILE = "interface.json"  # .pt2 extra file
KINDS = ("policy", "simulator_step")
DTYPES = ("float32", "float64", "float16", "uint8", "int8", "int32", "int64", "bool")
PACKAGES = ("embodichain-sl", "embodichain-models", "torch", "onnx", "onnxscript", "onnxruntime",
            "numpy")


def normalized_interface(declared: Any, factory: str) -> dict[str, Any]:
    """The model's declared interface in format 1; UsageError naming what is wrong."""
    where = f"the interface() of factory {factory!r}'s model"
    if not isinstance(declared, Mapping):
        raise UsageError(f"{where} returned {type(declared).__name__}, not a dict")
    kind = declared.get("kind", "policy")
    if kind not in KINDS:
        raise UsageError(f"{where}: kind {kind!r} is not one of {list(KINDS)}")
    observations = declared.get("observations")
    if not isinstance(observations, Mapping) or not observations:
        raise UsageError(f"{where} names no observations (a dict key -> shape, dtype, meaning)")
    result: dict[str, Any] = {"format": FORMAT, "kind": kind,
                              "observations": {str(k): _feature(v, f"{where}: observation {k!r}")
                                               for k, v in observations.items()}}
    action = declared.get("action")
    if action is None and isinstance(declared.get("actions"), Mapping) \
            and len(declared["actions"]) == 1:  # {key: spec} with one key
        (key, spec), = declared["actions"].items()
        action = {"key": key, **dict(spec)}
    if not isinstance(action, Mapping) or "key" not in action:
        raise UsageError(f"{where} names no action (a dict with key, shape, dtype, meaning)")
    result["action"] = {"key": str(action["key"]),
                        **_feature(action, f"{where}: action {action['key']!r}")}
    if declared.get("fps") is not None:
        result["fps"] = _positive(declared["fps"], f"{where}: fps")
    if kind == "policy":
        chunk = int(_positive(declared.get("chunk"), f"{where}: chunk"))
        shape = result["action"]["shape"]
        if len(shape) == 1:  # [action_dim]: the chunk dimension is implied
            result["action"]["shape"] = shape = [chunk, *shape]
        if shape[0] != chunk:
            raise UsageError(f"{where}: action shape {shape} does not start with the chunk "
                             f"length {chunk} ([chunk, action_dim])")
        result["chunk"] = chunk
        result["execution"] = _execution(declared.get("execution"), chunk, where)
    if declared.get("noise") is not None:
        result["noise"] = _noise(declared["noise"], result["observations"], where)
        result["format"] = NOISE_FORMAT
    for key, value in declared.items():  # anything else the model says travels along
        if key not in result and key not in ("actions", "action"):
            result[key] = value
    return result


def _feature(spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, Mapping) or "shape" not in spec:
        raise UsageError(f"{where} has no shape")
    shape = list(spec["shape"])
    if not all(isinstance(d, int) and d > 0 for d in shape):
        raise UsageError(f"{where}: shape {shape} is not a list of positive integers")
    dtype = str(spec.get("dtype", "float32")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise UsageError(f"{where}: dtype {dtype!r} is not one of {list(DTYPES)}")
    feature = {"shape": shape, "dtype": dtype, "meaning": str(spec.get("meaning", ""))}
    stack = spec.get("stack")
    if stack is not None:  # given one step at a time; the model takes the last `stack`
        if isinstance(stack, bool) or not isinstance(stack, int) or stack < 1:
            raise UsageError(f"{where}: stack {stack!r} is not a positive integer")
        feature["stack"] = stack
    source = spec.get("source")
    if source is not None:  # where an environment that names it otherwise gives it
        if not isinstance(source, list | tuple) or not source or not all(
                isinstance(part, str) for part in source):
            raise UsageError(f"{where}: source {source!r} is not a list of keys")
        feature["source"] = list(source)
    return feature


def _noise(spec: Any, observations: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The sampler's noise input: a key of its own, a float32 shape, the runner's rule."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("key"), str) \
            or spec["key"] in observations:
        raise UsageError(f"{where}: noise {spec!r} names no input key of its own (a dict with "
                         "key, shape and the runner's NOISE_RULE)")
    rule = {k: spec.get(k) for k in NOISE_RULE}
    if rule != NOISE_RULE:
        raise UsageError(f"{where}: noise rule {rule} is not the one runners draw by, "
                         f"{NOISE_RULE}")
    feature = _feature(spec, f"{where}: noise {spec['key']!r}")
    if feature["dtype"] != "float32" or "stack" in feature:
        raise UsageError(f"{where}: noise {spec['key']!r} is float32 and not stacked")
    return {"key": spec["key"], **feature, **NOISE_RULE}


def model_inputs(interface: Mapping[str, Any]) -> list[str]:
    """The model's positional inputs: the observations' keys, then the noise's if any."""
    noise = interface.get("noise")
    return [*interface["observations"], *([noise["key"]] if noise else [])]


def _positive(value: Any, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or not math.isfinite(value):
        raise UsageError(f"{where} must be a positive number, got {value!r}")
    return value


def _execution(value: Any, chunk: int, where: str) -> dict[str, float | int]:
    if isinstance(value, Mapping) and set(value) == {"horizon"}:
        horizon = value["horizon"]
        if isinstance(horizon, int) and 1 <= horizon <= chunk:
            return {"horizon": horizon}
    if isinstance(value, Mapping) and set(value) == {"temporal_ensemble"}:
        m = value["temporal_ensemble"]
        if isinstance(m, int | float) and not isinstance(m, bool) and math.isfinite(m):
            return {"temporal_ensemble": float(m)}
    raise UsageError(f"{where}: execution {value!r} is not {{'horizon': 1..{chunk}}} or "
                     "{'temporal_ensemble': m}")


def provenance(run: Mapping[str, Any], step: int, checkpoint: str, ema: bool
               ) -> dict[str, Any]:
    """Where the artifact's weights came from: run, update, recipe digest, packages."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"run_id": run.get("run_id"), "update": step, "factory": run.get("factory"),
            "recipe_sha256": run.get("config_sha256"), "checkpoint": checkpoint,
            "weights": "ema" if ema else "model",
            "exported_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "packages": versions}
