"""Checkpoint files: self-verifying, atomically written, safely loaded (R-CKPT-1..4, 7).

A checkpoint is a plain `torch.save` dict, so `torch.load(path, weights_only=True)` opens
it in a notebook:

    {"manifest": {format, format_version, step, run_id, world_size, config_sha256,
                  payload_sha256},
     "payload":  {"run": {...identity, config...}, "learner": {...}, "ranks": {0: ..., 1: ...},
                  "callbacks": {...}}}

The payload holds only tensors and plain Python values, so no allow-list is ever needed,
and its digest (every tensor's dtype, shape and bytes plus all other content) is recomputed
on every load.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pickle
import secrets
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from embodichain.core.checkpoint.disk_plan import (
    DiskFullError,
    disk_full,
    free_bytes,
    serialized_bytes,
)
from embodichain.core.errors import (
    CheckpointCorruptError,
    CheckpointError,
    UnsafeCheckpointError,
    UsageError,
)

FORMAT = "embodichain.checkpoint"
FORMAT_VERSION = 1
# ----------------------------------------------------------------------------------------
# Digest


def payload_digest(payload: Any) -> str:
    h = hashlib.sha256()
    _feed(h, payload)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        h.update(_tensor_view(t))
    elif type(value) in (dict, OrderedDict):  # state_dicts are OrderedDicts
        h.update(f"D{len(value)};".encode())
        for key in sorted(value, key=lambda k: (type(k).__name__, repr(k))):
            _feed(h, key)
            _feed(h, value[key])
    elif type(value) in (list, tuple):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for item in value:
            _feed(h, item)
    elif type(value) is str:  # exact types: subclasses (e.g. TorchVersion) need unpickling
        data = value.encode()
        h.update(f"S{len(data)};".encode() + data)
    elif value is None or type(value) in (bool, int):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif type(value) is float:
        h.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, torch.dtype | torch.device | torch.Size):
        h.update(f"{type(value).__name__}:{value};".encode())
    else:
        raise TypeError(f"checkpoint payload holds a {type(value).__name__}; only tensors and "
                        "plain Python values are allowed (they load with weights_only=True)")


def _tensor_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor without copying them: hashlib then hashes large
    buffers without holding the GIL, which a background save shares with training."""
    size = t.numel() * t.element_size()
    if not size:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(t.data_ptr())).cast("B")


def make_checkpoint(payload: dict[str, Any]) -> dict[str, Any]:
    """Wrap a payload with its manifest."""
    run = payload["run"]
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": int(run["step"]),
        "run_id": run.get("run_id"),
        "world_size": int(run["world_size"]),
        "config_sha256": run["config_sha256"],
        "payload_sha256": payload_digest(payload),
    }
    return {"manifest": manifest, "payload": payload}


# ----------------------------------------------------------------------------------------
# Writing


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def published_atomically(out: Path, *, keep_suffix: bool = False) -> Iterator[Path]:
    """A temporary path beside `out` for the caller to write; when the block ends without
    an error it is fsynced and renamed onto `out` (whole or absent, never half-written);
    whatever happens, it is gone afterwards. `keep_suffix`: the temporary name ends with
    `out`'s suffix (writers that tell a format by it). An OSError is a UsageError (exit 2)
    naming `out`."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{out} cannot be written: {exc.strerror or exc}") from None
    stem, suffix = (out.stem, out.suffix) if keep_suffix else (out.name, "")
    tmp = out.parent / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp{suffix}"
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
        fsync_directory(out.parent)
    except OSError as exc:
        raise UsageError(f"{out} cannot be written: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def write_checkpoint(checkpoint: Mapping[str, Any], path: Path, *, also_as: Path | None = None
                     ) -> None:
    """Write atomically: temp file, fsync, rename; `also_as` (e.g. last.pt) first, as a link.

    Temp names never end in `.pt`, so `*.pt` only ever matches complete checkpoints. The
    extra name is published before the step file, so `last.pt` exists as soon as any
    `step_N.pt` does. On failure the original error propagates and only this call's own
    temp files are removed; a full disk raises DiskFullError (bytes needed and free).
    """
    directory = path.parent
    unique = f"{os.getpid()}.{secrets.token_hex(4)}"
    tmp = directory / f".{path.name}.{unique}.tmp"
    alias_tmp = directory / f".{also_as.name}.{unique}.tmp" if also_as else None
    created: list[Path] = []
    try:
        _write_and_publish(checkpoint, path, tmp, also_as, alias_tmp, created)
    except Exception as exc:  # the temp files are gone: their space counts as free
        if disk_full(exc):
            raise DiskFullError(path, serialized_bytes(torch.save, dict(checkpoint)),
                                free_bytes(directory)) from exc
        raise


def _write_and_publish(checkpoint: Mapping[str, Any], path: Path, tmp: Path,
                       also_as: Path | None, alias_tmp: Path | None, created: list[Path]
                       ) -> None:
    directory = path.parent
    try:
        with open(tmp, "wb") as f:
            created.append(tmp)
            torch.save(dict(checkpoint), f)
            f.flush()
            os.fsync(f.fileno())
        if also_as is not None and alias_tmp is not None:
            created.append(alias_tmp)
            _link_or_copy(tmp, alias_tmp)
            os.replace(alias_tmp, also_as)
        os.replace(tmp, path)
        fsync_directory(directory)
    finally:
        for leftover in created:  # already renamed on success
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # filesystems without hard links
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
            fout.flush()
            os.fsync(fout.fileno())


# ----------------------------------------------------------------------------------------
# Reading


def read_checkpoint(path: str | Path, *, mmap: bool = False) -> dict[str, Any]:
    """Load and verify a checkpoint; raises a CheckpointError subclass naming the problem.
    `mmap`: tensors memory-mapped, not read into memory (the digest still reads them all)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    _check_archive(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if "weights only load failed" in str(exc).lower() or "weights_only" in str(exc):
            first = str(exc).split("\n")
            detail = next((line for line in first if "Unsupported" in line or "GLOBAL" in line),
                          first[0])
            raise UnsafeCheckpointError(
                f"refusing to load {path}: it would need arbitrary unpickling, which can run "
                f"code ({detail.strip()}). embodichain checkpoints hold only tensors and plain "
                "values; this file was not written by embodichain or was tampered with"
            ) from None
        raise CheckpointCorruptError(f"checkpoint {path} is corrupt: {exc}") from None
    except Exception as exc:
        if "TORCH_FORCE_" in str(exc):  # both force-load variables set: not the file's fault
            raise CheckpointError(f"cannot load {path}: {exc}") from None
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt or truncated ({type(exc).__name__}: {exc})"
        ) from None
    return verify_checkpoint(data, path)


def _check_archive(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        raise CheckpointCorruptError(f"checkpoint {path} is corrupt: empty (0 bytes), truncated")
    magic = b"PK\x03\x04"
    if len(head) < len(magic) and magic.startswith(head):
        raise CheckpointCorruptError(f"checkpoint {path} is corrupt or truncated "
                                     f"({len(head)} bytes)")
    same = sum(a == b for a, b in zip(head, magic, strict=False))
    if head != magic and len(head) == len(magic) and same >= 3:
        # one damaged byte of a torch archive's first header, not another kind of file
        raise CheckpointCorruptError(f"checkpoint {path} is corrupt: its archive header "
                                     f"starts with {head!r}")
    if head != magic:  # torch.save writes a zip archive; this is something else
        raise CheckpointError(f"{path} is not an embodichain checkpoint: not a torch file "
                              "(torch.save writes a zip archive; this one starts with "
                              f"{head!r})")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            # torch's reader (miniz) treats a member with the DOS directory attribute as a
            # directory and returns unread memory for it; Python's CRC check ignores the flag.
            flagged = [i.filename for i in archive.infolist()
                       if i.external_attr & 0x10 or i.filename.endswith("/")]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt or truncated (not a complete archive: {exc})"
        ) from None
    except Exception as exc:  # zlib/struct errors on damaged headers
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt ({type(exc).__name__}: {exc})"
        ) from None
    if bad is not None:
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt: archive member '{bad}' fails its CRC check"
        )
    if flagged:
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt: archive member '{flagged[0]}' is marked as a "
            "directory")


def verify_checkpoint(data: Any, path: Path | str = "<memory>") -> dict[str, Any]:
    """Check the manifest and recompute the payload digest."""
    if not isinstance(data, dict) or "manifest" not in data or "payload" not in data:
        raise CheckpointError(f"{path} is not an embodichain checkpoint (no manifest)")
    manifest = data["manifest"]
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an embodichain checkpoint (unknown format)")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{path} has checkpoint format version {version}; this "
                              f"embodichain reads version {FORMAT_VERSION}")
    try:
        digest = payload_digest(data["payload"])
    except TypeError as exc:
        raise CheckpointCorruptError(f"checkpoint {path} is corrupt: {exc}") from None
    if digest != manifest.get("payload_sha256"):
        raise CheckpointCorruptError(
            f"checkpoint {path} is corrupt: its content does not match its digest "
            f"(stored {str(manifest.get('payload_sha256'))[:16]}..., computed {digest[:16]}...)"
        )
    run = data["payload"].get("run", {})
    for key in ("step", "run_id", "world_size", "config_sha256"):
        if manifest.get(key) != run.get(key):
            raise CheckpointCorruptError(
                f"checkpoint {path} is corrupt: manifest {key}={manifest.get(key)!r} "
                f"disagrees with its payload ({run.get(key)!r})")
    return data
