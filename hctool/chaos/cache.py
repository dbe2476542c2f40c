"""What every run of one exploration shares, kept across invocations: the storage
seed (the setup run's L3 files) and the no-cache reference answers.

Both are pure functions of the engine code, the scenario's setup and workload,
the model and the TP size, so they are computed once per such key and reused by
every later `chaos explore | run | shrink` (a CI shard, a replay, a shrink), which
saves the ~20 s setup + reference run of each invocation. The key hashes the
engine's source files, so an engine change never reads a stale reference.
HCTOOL_CACHE_DIR moves the cache (default ~/.cache/hctool); HCTOOL_CACHE_DIR=off
turns it off."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from engine.lab import ENGINE_ROOT
from hctool.protocol.env import cache_root




def prepare_key(harness) -> str:
    s = harness.s
    h = hashlib.sha256()
    for p in sorted(ENGINE_ROOT.rglob("*.py")):
        h.update(str(p.relative_to(ENGINE_ROOT)).encode() + b"\0" + p.read_bytes())
    first = s.server_args(s.variants[0], harness.tp)
    h.update(json.dumps({"args": first.to_json(), "setup": list(s.setup_flags), "tp": harness.tp,
                         "workload": dataclasses.asdict(s.workload)}, sort_keys=True).encode())
    return h.hexdigest()[:20]


def load(harness) -> bool:
    """Fill the harness's storage seed and reference from the cache; False on a miss."""
    root = cache_root()
    entry = root / "prepare" / prepare_key(harness) if root else None
    if entry is None or not (entry / "reference.json").is_file():
        return False
    seed = entry / "storage-seed"
    harness.storage_seed = seed if seed.is_dir() else None
    ref = json.loads((entry / "reference.json").read_text())
    harness.reference = {(r, i): out for r, i, out in ref}
    return True


def save(harness) -> None:
    """Store what harness.prepare() made; a concurrent writer of the same key wins
    harmlessly (same content), a failure only costs the next invocation a setup."""
    root = cache_root()
    if root is None or harness.reference is None:
        return
    final = root / "prepare" / prepare_key(harness)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".tmp-"))
        if harness.storage_seed is not None:
            shutil.copytree(harness.storage_seed, tmp / "storage-seed")
        (tmp / "reference.json").write_text(json.dumps([[r, i, out] for (r, i), out in harness.reference.items()]))
        try:
            os.rename(tmp, final)
        except OSError:  # someone stored it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass
