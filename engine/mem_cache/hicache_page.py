"""SGLang: none (HiCacheFile there stores raw tensors; here every page is checked).

The on-disk form of the L3 file backend: a directory proven writable at start,
and one file per page: a 64-byte header, then the page's K/V bytes.

The header carries who wrote the page (a digest of the model config and seed,
dtype, page size, TP size and rank, layout version), which key it belongs to, and
a checksum of the payload. A read checks all three, and that every value is
finite, so a flipped byte, another page's file, a page of another model or seed,
or a page of NaNs is a miss (recomputed and rewritten), never served.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

LAYOUT_VERSION = 1
MAGIC = b"HCKV"
HEADER = struct.Struct("<4sHH16s16s16sQ")  # magic, version, 0, writer, key, checksum, payload bytes
DIGEST = 16


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST).digest()


def writer_identity(model: dict, dtype: str, page_size: int, tp_size: int, tp_rank: int, shape: tuple) -> bytes:
    """Everything that decides what a page's bytes mean, as one digest."""
    what = {
        "model": model,
        "dtype": dtype,
        "page_size": page_size,
        "tp_size": tp_size,
        "tp_rank": tp_rank,
        "page_shape": list(shape),
        "layout": LAYOUT_VERSION,
    }
    return _digest(json.dumps(what, sort_keys=True).encode())


class PageCheck(NamedTuple):
    payload: np.ndarray | None  # float32 values, or None when the page must not be used
    problem: str  # "" when payload is good


def encode(identity: bytes, key: str, payload: bytes) -> bytes:
    return (
        HEADER.pack(MAGIC, LAYOUT_VERSION, 0, identity, _digest(key.encode()), _digest(payload), len(payload)) + payload
    )


def decode(data: bytes, identity: bytes, key: str, payload_bytes: int) -> PageCheck:
    if len(data) != HEADER.size + payload_bytes:
        return PageCheck(None, f"size {len(data)} bytes, expected {HEADER.size + payload_bytes}")
    magic, version, _, who, key_digest, checksum, size = HEADER.unpack_from(data)
    if magic != MAGIC or version != LAYOUT_VERSION:
        return PageCheck(None, "not a page of this layout version")
    if who != identity:
        return PageCheck(None, "written by another model, seed, dtype, page size or TP rank")
    if key_digest != _digest(key.encode()) or size != payload_bytes:
        return PageCheck(None, "holds another page")
    payload = data[HEADER.size :]
    if _digest(payload) != checksum:
        return PageCheck(None, "checksum mismatch")
    values = np.frombuffer(payload, dtype=np.float32).copy()
    if not np.isfinite(values).all():
        return PageCheck(None, "non-finite values")
    return PageCheck(values, "")


class StorageDirError(ValueError):
    """The storage directory cannot hold pages; the message is one line."""


def check_storage_dir(directory: str | Path) -> Path:
    """Create the directory if needed and prove a file can be written there, so a
    storage that cannot work fails at start with one line, not in a rank later.
    (No torch here: `hctool launch` calls it before starting anything.)"""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise StorageDirError(f"storage directory {path} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        # mkstemp (O_EXCL, a random name): a link planted in a shared folder is never written through
        fd, probe = tempfile.mkstemp(dir=path, prefix=".hctool-probe-")
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise StorageDirError(f"storage directory {path} is not usable: {exc.strerror or exc}") from None
    return path
