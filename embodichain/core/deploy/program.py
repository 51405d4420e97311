"""The model's deployable forward as a `torch.export` program, or a refusal naming the
operation that cannot be exported.

The factory says what is deployed: the model's `deployable()` returns the module whose
forward maps raw float32 observations (batched, in the order of `interface()`'s
observations) to the output (a policy's un-normalised action chunk), normalisation inside.
The training objective is never exported.
"""

from __future__ import annotations

import inspect
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodichain.core.errors import UsageError

MAX_BATCH = 4096
_TORCH_DIR = str(Path(torch.__file__).parent)
_HERE = str(Path(__file__).parent)


class Flat(nn.Module):
    """The deployable module behind positional inputs, one per observation key: its own
    positional forward, or one taking a dict of observations."""

    def __init__(self, module: nn.Module, keys: list[str]) -> None:
        super().__init__()
        self.module, self.keys = module, keys
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self.takes_dict = len(keys) > 1 and len(params) == 1

    def forward(self, *observations: torch.Tensor) -> torch.Tensor:
        if self.takes_dict:
            out = self.module(dict(zip(self.keys, observations, strict=True)))
        else:
            out = self.module(*observations)
        return out


def deployable_of(model: nn.Module, factory: str) -> tuple[nn.Module, Any]:
    """`(model.deployable(), model.interface())`, or UsageError saying how to declare them."""
    missing = [name for name in ("deployable", "interface")
               if not callable(getattr(model, name, None))]
    if missing:
        raise UsageError(
            f"the model of factory {factory!r} ({type(model).__name__}) declares no deployable "
            f"forward: it has no {' and no '.join(f'{m}()' for m in missing)}. A policy "
            "exports through deployable() -> nn.Module (raw observations -> action chunk, "
            "normalisation inside) and interface() -> dict (see docs/deploy.md)")
    module = model.deployable()
    if not isinstance(module, nn.Module):
        raise UsageError(f"the deployable() of factory {factory!r}'s model returned "
                         f"{type(module).__name__}, not a torch.nn.Module")
    return module.eval(), model.interface()


def example_inputs(interface: dict[str, Any], batch: int, seed: int = 0
                   ) -> tuple[torch.Tensor, ...]:
    """The model's inputs (observations, then the noise if it takes one) for the interface's
    shapes and dtypes: uniform in [0, 1) for floats, 0..255 for uint8, 0 or 1 otherwise."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    noise = [interface["noise"]] if interface.get("noise") else []
    for spec in [*interface["observations"].values(), *noise]:
        dtype = getattr(torch, spec["dtype"])
        shape = (batch, *([spec["stack"]] if spec.get("stack") else []), *spec["shape"])
        if dtype.is_floating_point:
            out.append(torch.rand(shape, generator=gen).to(dtype))
        else:
            high = 256 if dtype == torch.uint8 else 2
            out.append(torch.randint(0, high, shape, generator=gen).to(dtype))
    return tuple(out)


def export_program(module: Flat, interface: dict[str, Any], what: str
                   ) -> torch.export.ExportedProgram:
    """`torch.export` of the flat deployable with a dynamic batch dimension; UsageError
    naming the operation (file, line, code) that cannot be exported."""
    args = example_inputs(interface, batch=2)
    try:
        with torch.no_grad():
            eager = module(*args)
    except Exception as exc:
        raise UsageError(f"{what}: the deployable forward fails on observations of the "
                         f"interface's shapes: {failed_operation(exc)}") from None
    want = [2, *interface["action"]["shape"]]
    if not isinstance(eager, torch.Tensor) or list(eager.shape) != want:
        got = list(eager.shape) if isinstance(eager, torch.Tensor) else type(eager).__name__
        raise UsageError(f"{what}: the deployable forward returns {got} for a batch of 2, its "
                         f"interface says {want} ([batch, *action shape])")
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    # One entry: the *observations varargs, a dynamic batch dimension for each.
    try:
        with torch.no_grad():
            return torch.export.export(module, args, dynamic_shapes=(({0: batch},) * len(args),),
                                       strict=False)
    except Exception as exc:
        raise UsageError(f"{what} cannot be exported (torch.export): "
                         f"{failed_operation(exc)}. Nothing was written") from None


def failed_operation(exc: BaseException) -> str:
    """The operation that failed: the model's own line (file:line, code) where it raised,
    and the first line of torch's reason."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith((_TORCH_DIR, _HERE)) and "<" not in f.filename]
    reason = next((line.strip() for line in str(exc).splitlines() if line.strip()),
                  type(exc).__name__)
    if len(reason) > 300:
        reason = reason[:300] + "..."
    if not frames:
        return f"{type(exc).__name__}: {reason}"
    f = frames[-1]
    return f"`{(f.line or '').strip()}` at {f.filename}:{f.lineno} in {f.name} " \
           f"({type(exc).__name__}: {reason})"
