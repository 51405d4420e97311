"""A checkpoint's manifest read without torch and without running anything from the file:
what the `runs` table, the end-of-run summary and the run's messages need to know about a
snapshot (its step) without loading or verifying it."""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any


class _Inert:
    """Stands in for every non-builtin global while reading a checkpoint's manifest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass


class _ManifestUnpickler(pickle.Unpickler):
    """Reads torch.save's pickle without torch: tensors, storages and dtypes all become
    inert placeholders."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        return _Inert

    def persistent_load(self, pid: Any) -> None:
        return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the checkpoint at `path` (not verified); None if unreadable."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            data = archive.read(name)
        manifest = _ManifestUnpickler(io.BytesIO(data)).load()["manifest"]
    except Exception:  # damaged or foreign file
        return None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("step"), int):
        return None
    return manifest


def checkpoint_step(path: Path) -> int | None:
    """The step in a checkpoint's manifest, read without torch; None if unreadable."""
    manifest = read_manifest(path)
    return manifest["step"] if manifest is not None else None
