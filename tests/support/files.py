"""Looking at what a run left on disk: whole directories, checkpoint tensors; a policy
artifact with its interface edited."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def snapshot_dir(directory: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every directory (None), to assert that a refused command
    changed nothing: a file or a directory it created, removed or changed shows."""
    return {str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
            for p in sorted(directory.rglob("*"))}


def file_listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and modification time: a directory nothing
    wrote into (not even the same bytes again) lists the same."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


def tensors_by_path(value: object, path: str = ""):
    """Every tensor of a nested checkpoint payload, keyed like `/learner/model/0.weight`."""
    import torch

    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key in value:
            yield from tensors_by_path(value[key], f"{path}/{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from tensors_by_path(item, f"{path}/{i}")


def doctored_artifact(artifact: Path, out: Path, change: Callable[[dict], None]) -> Path:
    """A copy of an ONNX (or `.pt2`) artifact whose interface `change` edited in place (the
    model left as it is): what a foreign or hand-edited file looks like to a runner."""
    if artifact.suffix == ".pt2":
        import zipfile

        with zipfile.ZipFile(artifact) as src, zipfile.ZipFile(out, "w") as dst:
            for item in src.infolist():
                data = src.read(item)
                if item.filename.endswith("/interface.json"):
                    interface = json.loads(data)
                    change(interface)
                    data = json.dumps(interface).encode()
                dst.writestr(item, data)
        return out
    import onnx

    from embodichain.core.deploy.runner import INTERFACE_KEY

    model = onnx.load(str(artifact))
    entry = next(p for p in model.metadata_props if p.key == INTERFACE_KEY)
    interface = json.loads(entry.value)
    change(interface)
    entry.value = json.dumps(interface)
    onnx.save(model, str(out))
    return out
