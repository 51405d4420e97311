"""`export --policy`: a checkpoint's deployable forward as one ONNX or `.pt2` artifact.

The artifact holds the forward with normalisation baked in and its interface (keys, shapes,
dtypes, meanings, fps, chunk execution, provenance): ONNX metadata_props entry
`embodichain.interface`, or the `.pt2` extra file `interface.json`. Before it is published
(atomically; an existing file only with force) the written file is read back and run on
sample observations at batch 1 and 2, and must give the model's outputs within
rtol = atol = 1e-5 (float32); otherwise nothing is written.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.file import published_atomically
from embodichain.core.deploy.interface import (
    INTERFACE_KEY,
    PT2_INTERFACE_FILE,
    model_inputs,
    normalized_interface,
    provenance,
)
from embodichain.core.deploy.program import (
    Flat,
    deployable_of,
    example_inputs,
    export_program,
    failed_operation,
)
from embodichain.core.deploy.trained import trained_model
from embodichain.core.errors import UsageError
from embodichain.core.training.model_facts import DEMONSTRATION_SEEDS, DEMONSTRATION_SEEDS_UNKNOWN

FORMATS = {"onnx": ".onnx", "pt2": ".pt2"}
TOLERANCE = 1e-5
OPSET = 18


@dataclass(frozen=True)
class ExportedPolicy:
    """What was written: where, in which format, from which update, with which interface."""

    path: Path
    format: str
    step: int
    interface: dict[str, Any]
    max_difference: float


def policy_format(out: Path, fmt: str | None) -> str:
    """The format `--format` names, else the one OUT's suffix names (default onnx)."""
    if fmt is None:
        fmt = next((f for f, suffix in FORMATS.items() if out.suffix == suffix), "onnx")
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose onnx or pt2")
    if out.suffix != FORMATS[fmt]:
        raise UsageError(f"{out}: a {fmt} artifact's name ends in {FORMATS[fmt]} (runners "
                         "tell the format by it)")
    return fmt


EXPORT_STEPS = 4  # the `step(what)` calls of export_policy


def export_policy(checkpoint: Path, out: Path, *, fmt: str | None = None, ema: bool = False,
                  force: bool = False, data: Mapping[str, Any] | None = None,
                  step: Callable[[str], None] | None = None) -> ExportedPolicy:
    """Write the policy artifact of `checkpoint` to `out`; UsageError (exit 2, nothing
    written) for a bad OUT, a model without a deployable forward, an unexportable
    operation (named), or an artifact that does not act like the model. `step(what)` is
    called as each of its EXPORT_STEPS steps begins (the progress)."""
    step = step or (lambda what: None)
    out = Path(out)
    fmt = policy_format(out, fmt)
    if out.is_dir():
        raise UsageError(f"{out} is a directory; name the file to write, e.g. "
                         f"{out}/policy{FORMATS[fmt]}")
    if out.exists() and not force:
        raise UsageError(f"{out} exists; nothing was written. Pass --force to replace it")
    step("reading the checkpoint and rebuilding its model")
    trained = trained_model(Path(checkpoint), data, ema=ema)
    module, declared = deployable_of(trained.model, trained.factory)
    interface = normalized_interface(declared, trained.factory)
    interface["provenance"] = provenance(trained.run, trained.step, Path(checkpoint).name, ema)
    if trained.run.get(DEMONSTRATION_SEEDS):  # `eval ARTIFACT` refuses them (R-EVAL-6)
        interface["provenance"][DEMONSTRATION_SEEDS] = list(trained.run[DEMONSTRATION_SEEDS])
    if trained.run.get(DEMONSTRATION_SEEDS_UNKNOWN):  # ... or warns that it cannot
        interface["provenance"][DEMONSTRATION_SEEDS_UNKNOWN] = str(
            trained.run[DEMONSTRATION_SEEDS_UNKNOWN])
    evaluation = (trained.run.get("config") or {}).get("evaluation")
    if isinstance(evaluation, Mapping):  # where `embodichain eval ARTIFACT` runs it
        interface["evaluation"] = json.loads(json.dumps(evaluation))
    flat = Flat(module, model_inputs(interface)).eval()
    what = f"the deployable forward of factory {trained.factory!r}'s model"
    step("tracing the deployable forward (torch.export)")
    program = export_program(flat, interface, what)
    with published_atomically(out, keep_suffix=True) as tmp:  # exporters tell the format by it
        step(f"writing the {fmt} artifact")
        if fmt == "onnx":
            _write_onnx(program, interface, tmp, what)
        else:
            torch.export.save(program, tmp, extra_files={
                PT2_INTERFACE_FILE: json.dumps(interface)})
        step("checking the artifact against the model")
        difference = _check_artifact(tmp, fmt, flat, interface)
    return ExportedPolicy(out, fmt, trained.step, interface, difference)


def _write_onnx(program: torch.export.ExportedProgram, interface: dict[str, Any], path: Path,
                what: str) -> None:
    try:
        import onnx
        import onnxscript  # noqa: F401  (the dynamo exporter's dependency)
    except ImportError as exc:
        raise UsageError(f"ONNX export needs onnx and onnxscript ({exc.name} is missing): "
                         "pip install 'embodichain-sl[deploy]'") from None
    keys = model_inputs(interface)
    try:
        with _quiet_exporter():
            onnx_program = torch.onnx.export(program, (), dynamo=True, input_names=keys,
                                             output_names=[interface["action"]["key"]],
                                             opset_version=OPSET, verbose=False)
    except Exception as exc:
        raise UsageError(f"{what} cannot be exported to ONNX: {failed_operation(exc)}. "
                         "Nothing was written (--format pt2 may take it)") from None
    model = onnx_program.model_proto
    entry = model.metadata_props.add()
    entry.key, entry.value = INTERFACE_KEY, json.dumps(interface)
    model.producer_name = "embodichain"
    onnx.save(model, path)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Without the exporter's notes on what it skips: optional packages (torchvision's ops),
    constant folding of multi-output operations (the graph is correct without it)."""
    loggers = [logging.getLogger(name) for name in (
        "torch.onnx._internal.exporter._registration",
        "onnxscript.optimizer._constant_folding")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _check_artifact(path: Path, fmt: str, flat: Flat, interface: dict[str, Any]) -> float:
    """The largest difference between the written artifact and the eager model on sample
    observations; UsageError beyond the tolerance."""
    outputs = _artifact_forward(path, fmt, interface)
    worst = 0.0
    for batch, seed in ((1, 1), (2, 2)):
        args = example_inputs(interface, batch, seed)
        with torch.no_grad():
            want = flat(*args)
        got = torch.from_numpy(outputs([a.numpy() for a in args]))
        if got.shape != want.shape or not torch.allclose(got, want, rtol=TOLERANCE,
                                                         atol=TOLERANCE):
            raise UsageError(f"the exported {fmt} artifact does not act like the model "
                             f"(batch {batch}: shape {list(got.shape)} vs {list(want.shape)}, "
                             f"largest difference {_difference(got, want)}); nothing was "
                             "written")
        worst = max(worst, _difference(got, want))
    return worst


def _difference(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        return float("inf")
    return float((got.double() - want.double()).abs().max())


def _artifact_forward(path: Path, fmt: str, interface: dict[str, Any]) -> Any:
    if fmt == "pt2":
        extra = {PT2_INTERFACE_FILE: ""}
        module = torch.export.load(path, extra_files=extra).module()
        if json.loads(extra[PT2_INTERFACE_FILE]) != interface:
            raise UsageError(f"{path}: the interface read back differs from the one written")
        return lambda arrays: module(*(torch.from_numpy(a) for a in arrays)).detach().numpy()
    try:
        import onnxruntime as ort
    except ImportError:
        raise UsageError("checking the ONNX artifact needs onnxruntime: "
                         "pip install 'embodichain-sl[deploy]'") from None
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda arrays: session.run(None, dict(zip(names, arrays, strict=True)))[0]
