"""The sha256 of a file's bytes, streamed: one helper for data digests, checkpoint shards and
initial weights. It sits at the root of `core` because data and checkpoint both need it and
data may import none of the other sub-packages."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 22  # bytes hashed per read: a bounded buffer, whatever the file's size


def file_sha256(path: str | Path) -> str:
    """The sha256 (hex) of every byte of the file, read through one reused buffer."""
    digest, buffer = hashlib.sha256(), bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while count := f.readinto(buffer):
            digest.update(view[:count])
    return digest.hexdigest()
