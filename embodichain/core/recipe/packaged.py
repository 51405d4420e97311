"""Example recipes that packages ship, for `embodichain init NAME FILE` (no checkout needed).

A distribution registers a recipe under the entry-point group `embodichain.sl_recipes`:
the entry point's name is the recipe's name and its value a package that holds `NAME.yaml`
as package data, e.g. `sl_ddp = "embodichain.plugins.recipes"`. Such a package imports
nothing heavy, so finding and copying a recipe never imports torch or the factory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import importlib_metadata

from embodichain.core.errors import RefusedError, UsageError, did_you_mean

RECIPE_GROUP = "embodichain.sl_recipes"


@dataclass(frozen=True)
class RecipeInfo:
    """One packaged recipe: `init` name, the package holding `NAME.yaml`, its distribution."""

    name: str
    package: str
    distribution: str | None


def registered_recipes() -> list[RecipeInfo]:
    """Every entry point of the recipe group, without importing anything."""
    found = []
    for ep in importlib_metadata.entry_points(group=RECIPE_GROUP):
        dist = None
        try:  # damaged metadata must not hide the other recipes
            dist = ep.dist.metadata["Name"] if ep.dist is not None else None
        except Exception:
            pass
        found.append(RecipeInfo(ep.name, ep.value.strip(), dist))
    return sorted(found, key=lambda info: (info.name, info.distribution or ""))


def recipe_text(name: str) -> str:
    """The YAML text of the packaged recipe `name`; UsageError if there is none."""
    infos = registered_recipes()
    matches = [info for info in infos if info.name == name]
    if not matches:
        names = sorted({info.name for info in infos})
        hint = did_you_mean(name, names)
        raise UsageError(f"no packaged recipe named '{name}' ({hint}available: "
                         f"{', '.join(names) or 'none'}; entry-point group {RECIPE_GROUP})")
    info = matches[0]
    try:
        return resources.files(info.package).joinpath(f"{name}.yaml").read_text("utf-8")
    except (ImportError, OSError) as exc:
        raise UsageError(f"recipe '{name}' of distribution {info.distribution or '?'} is "
                         f"registered but {info.package}/{name}.yaml cannot be read: "
                         f"{exc}") from None


# The trainer's optional keys, as commented lines `init` adds to a copy: (key, default, what).
OPTIONAL_TRAINER_KEYS = (
    ("grad_accumulation", "1", "micro-batches of batch_size per update"),
    ("ema", "null", "{decay: 0.999, validate: ema | model | both}: an average of the weights"),
    ("precision", "fp32", "fp32 | bf16 | fp16 (CUDA)"),
    ("compile", "false", "train through torch.compile"),
    ("data_workers", "0", "worker processes loading a DatasetSource"),
    ("prefetch", "2", "batches each data worker loads ahead"),
    ("sampling", "with_replacement", "with_replacement | epochs"),
    ("best", "null", "{metric: validation/mse, mode: min}: the metric that matters"),
    ("save_best", "false", "keep best.pt (needs validate_every)"),
    ("early_stop", "null", "{patience: 5, min_delta: 0.0} validations without improvement"),
    ("keep_last", "null", "keep only the newest N step files"),
    ("async_save", "true", "write checkpoints on a background thread"),
    ("save_every_s", "null", "also write last.pt every this many seconds"),
    ("collective_timeout", "5m", "an update waiting longer ends the run, naming who hangs"),
    ("on_nonfinite", "stop", "stop | skip an update whose loss is not finite"),
    ("skip_guard", "copy", "copy | sync: how a GPU skips an update (non-fused optimizers)"),
    ("deterministic", "false", "deterministic kernels (CUDA run-to-run reproducibility)"),
)


def with_optional_trainer_keys(text: str) -> str:
    """`text` with the trainer keys it does not set listed, commented out, at the end of
    its `trainer:` block (same indentation), so a copy shows what else there is."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == "trainer:"), None)
    if start is None:
        return text
    end, indent = start + 1, None
    while end < len(lines) and (not lines[end].strip() or lines[end][:1] in " \t"):
        if lines[end].strip() and indent is None:
            indent = lines[end][:len(lines[end]) - len(lines[end].lstrip())]
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    present = {line.strip().partition(":")[0] for line in lines[start + 1:end]}
    missing = [k for k in OPTIONAL_TRAINER_KEYS if k[0] not in present]
    if not missing or indent is None:
        return text
    width = max(len(f"{k}: {d}") for k, d, _ in missing)
    added = [f"{indent}# optional, with their defaults:\n"] + [
        f"{indent}# {f'{k}: {d}':<{width}}  # {what}\n" for k, d, what in missing]
    if not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    return "".join(lines[:end] + added + lines[end:])


def write_recipe_copy(name: str, destination: Path, header: str = "") -> Path:
    """Write `header` + the packaged recipe to `destination` (with the optional trainer keys
    listed, commented), never replacing a file."""
    text = with_optional_trainer_keys(recipe_text(name))
    if destination.exists() or destination.is_symlink():
        raise RefusedError(f"{destination} already exists; choose another file name or remove "
                           "it first. Nothing was changed.")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: a file that appears meanwhile is never overwritten either.
        fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise RefusedError(f"{destination} already exists; nothing was changed") from None
    except OSError as exc:
        raise UsageError(f"cannot write {destination}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(header + text)
    return destination
